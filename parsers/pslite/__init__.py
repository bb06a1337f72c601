"""parsers/pslite"""
