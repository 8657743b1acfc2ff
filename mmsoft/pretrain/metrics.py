"""Top-k accuracy of image classifiers."""
from typing import Dict, List, Optional, Sequence

import torch
from mmengine.evaluator import BaseMetric
from mmengine.registry import METRICS

from .head import topk_accuracy


@METRICS.register_module()
class ClassificationAccuracy(BaseMetric):
    """Top-k accuracy (percent) over a dataset.

    Reads the ``pred_score`` and ``gt_label`` of the predicted data samples;
    k larger than the number of classes counts every image as correct.

    Args:
        topk (Sequence[int]): Values of k. Default: (1, 5).
        collect_device (str): ``'cpu'`` or ``'gpu'``. Default: ``'cpu'``.
        prefix (str, optional): Metric name prefix. Default: ``'accuracy'``,
            giving ``accuracy/top1``, ``accuracy/top5``.
    """
    default_prefix: Optional[str] = 'accuracy'

    def __init__(self, topk: Sequence[int] = (1, 5), collect_device: str = 'cpu',
                 prefix: Optional[str] = None):
        super().__init__(collect_device=collect_device, prefix=prefix)
        if not topk or any(not isinstance(k, int) or k < 1 for k in topk):
            raise ValueError(f'topk={topk!r} must be positive ints.')
        self.topk = tuple(topk)

    def process(self, data_batch, data_samples: Sequence[dict]) -> None:
        for sample in data_samples:
            self.results.append(dict(
                score=torch.as_tensor(sample['pred_score']).detach().cpu(),
                label=int(torch.as_tensor(sample['gt_label']).reshape(-1)[0])))

    def compute_metrics(self, results: List[dict]) -> Dict[str, float]:
        scores = torch.stack([r['score'] for r in results])
        labels = torch.tensor([r['label'] for r in results])
        values = topk_accuracy(scores, labels, self.topk)
        return {f'top{k}': float(v) for k, v in zip(self.topk, values)}
