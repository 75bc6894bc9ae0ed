"""The report stage: results files in, the HTML report out (write.py), with its verdict (verdict.py, answer.py),
prices (costs.py), prediction (predict.py), figures and pictures.

It reads what loadtest/ wrote (loadtest/results.py) and the bench's files; nothing in loadtest/ or server/
imports it, and it imports neither torch, onnxruntime nor the server.
"""
