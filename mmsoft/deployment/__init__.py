"""Deployment of the backbones: ONNX export and onnxruntime inference.

Importing this package needs only PyTorch and mmengine; onnx and onnxruntime
(``requirements/deploy.txt``) are imported when a function needs them.
"""
from .onnx_export import (FeatureMaps, build_feature_model, check_onnx_file,
                          compare_outputs, export_formulation, export_onnx,
                          onnxruntime_session, profile_onnxruntime,
                          run_onnxruntime, verify_onnx)

__all__ = [
    'FeatureMaps', 'build_feature_model', 'check_onnx_file', 'compare_outputs',
    'export_formulation', 'export_onnx', 'onnxruntime_session',
    'profile_onnxruntime', 'run_onnxruntime', 'verify_onnx'
]
