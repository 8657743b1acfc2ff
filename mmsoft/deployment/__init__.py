"""Deployment of the backbones: ONNX export and onnxruntime inference.

Importing :mod:`.onnx_export` needs only PyTorch (mmengine only for a
config's model, :func:`~.onnx_export.build_feature_model`); onnx and
onnxruntime (``requirements/deploy.txt``) are imported when a function needs
them. Its names load when first used, so that :mod:`.traceable` (torch alone,
run by the models' export formulation) imports without them.
"""
import importlib

_ONNX_EXPORT = ('FeatureMaps', 'FlatOutputs', 'build_feature_model',
                'check_onnx_file', 'compare_outputs', 'export_formulation',
                'export_onnx', 'onnxruntime_session', 'output_tensors',
                'profile_onnxruntime', 'run_onnxruntime', 'verify_onnx')


def __getattr__(name: str):
    if name in _ONNX_EXPORT:
        return getattr(importlib.import_module(f'{__name__}.onnx_export'), name)
    raise AttributeError(f'module {__name__!r} has no attribute {name!r}')


__all__ = list(_ONNX_EXPORT)
