"""Load testing with Locust (open-loop arrivals, exact percentiles), results files and the report.

Nothing here imports torch, onnxruntime or the server.
"""
