"""workloads/psbench"""
