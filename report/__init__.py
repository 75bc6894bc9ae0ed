"""The report stage: results files in, the HTML report out (write.py). Each model's findings are built once
(findings.py, from best.py and rates.py: the best deployment per provider and SLO, its price, the crossover);
the renderers only render them: the first screen (answer.py), the verdict sentences (verdict.py), the tables
(sections.py), the pictures (pictures.py, figures.py). Beside them: how a curve is named (naming.py), the prices
given (prices.py) and what serving costs (costs.py), the prediction (predict.py) and the bench's figures.

It reads what loadtest/ wrote (loadtest/results.py) and the bench's files; nothing in loadtest/ or server/
imports it, and it imports neither torch, onnxruntime nor the server.
"""
