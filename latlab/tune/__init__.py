"""`latlab tune`: the configuration search (search.py, pure logic over a probe callable), its probes on a real
server (run.py), and the lab's search step built on them (lab_search.py)."""
