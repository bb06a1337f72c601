"""workloads/cluster"""
