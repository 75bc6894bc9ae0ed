"""MLServer's custom runtime for an ONNX file through ONNX Runtime on one CPU thread (its path is the model settings'
parameters.uri): copied as runtime.py into an MLServer model folder by benchmarks/other_servers.py and by
tests/e2e/test_mlserver.py, never imported by latlab."""

import onnxruntime as ort
from mlserver import MLModel
from mlserver.codecs import NumpyCodec
from mlserver.types import InferenceRequest, InferenceResponse


class OnnxModel(MLModel):
    """An ONNX file through ONNX Runtime on one CPU thread; its path is the model settings' parameters.uri."""

    async def load(self) -> bool:
        options = ort.SessionOptions()
        options.intra_op_num_threads = 1
        self.session = ort.InferenceSession(self.settings.parameters.uri, options, providers=["CPUExecutionProvider"])
        self.output_names = [o.name for o in self.session.get_outputs()]
        return True

    async def predict(self, request: InferenceRequest) -> InferenceResponse:
        outputs = self.session.run(None, {i.name: NumpyCodec.decode_input(i) for i in request.inputs})
        return InferenceResponse(
            model_name=self.name,
            outputs=[NumpyCodec.encode_output(name, value) for name, value in zip(self.output_names, outputs)],
        )
