"""What runs inside each rank of ``unidist launch``: its bootstrap and its runtime hooks.

Nothing here imports the launcher's rooms: a rank pays for what it uses.
"""
