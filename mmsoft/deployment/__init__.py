"""ONNX export and onnxruntime runs (:mod:`.onnx_export`, needs onnx and
onnxruntime only to check and run a file). Its names load when first used, so
that :mod:`.traceable`, which the models import, needs torch alone."""
import importlib

_ONNX_EXPORT = ('FlatOutputs', 'check_onnx_file', 'export_formulation',
                'export_onnx', 'onnxruntime_session', 'output_tensors',
                'run_onnxruntime', 'verify_onnx')


def __getattr__(name: str):
    if name in _ONNX_EXPORT:
        return getattr(importlib.import_module(f'{__name__}.onnx_export'), name)
    raise AttributeError(f'module {__name__!r} has no attribute {name!r}')


__all__ = list(_ONNX_EXPORT)
