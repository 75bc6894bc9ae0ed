"""Load testing with Locust (open-loop arrivals, exact percentiles), the SLO search and the results files
(results.py: the contract the report stage, report/, reads).

Nothing here imports torch, onnxruntime, the server or the report.
"""
