import sys

import numpy as np
import onnxruntime as ort
from pytriton.decorators import batch
from pytriton.model_config import DynamicBatcher, ModelConfig, Tensor
from pytriton.triton import Triton, TritonConfig

model, name, x, y, width_in, width_out, http, grpc, metrics = sys.argv[1:]
options = ort.SessionOptions()
options.intra_op_num_threads = 1
session = ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])


@batch
def infer(**inputs):
    return {y: session.run(None, {x: inputs[x]})[0]}


config = TritonConfig(http_address="127.0.0.1", http_port=int(http), grpc_address="127.0.0.1",
                      grpc_port=int(grpc), metrics_port=int(metrics))
with Triton(config=config) as triton:
    triton.bind(model_name=name, infer_func=infer,
                inputs=[Tensor(name=x, dtype=np.float32, shape=(int(width_in),))],
                outputs=[Tensor(name=y, dtype=np.float32, shape=(int(width_out),))],
                config=ModelConfig(max_batch_size=64, batcher=DynamicBatcher(max_queue_delay_microseconds=2000)))
    triton.serve()
