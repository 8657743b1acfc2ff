"""Top-k accuracy of image classifiers (mmpretrain's ``Accuracy`` metric)."""
from typing import Dict, List, Optional, Sequence, Tuple, Union

import torch
from mmengine.evaluator import BaseMetric
from mmengine.registry import METRICS


def topk_accuracy(logits: torch.Tensor, labels: torch.Tensor,
                  topk: Sequence[int] = (1, )) -> Tuple[torch.Tensor, ...]:
    """Percentage of rows whose label is among the ``k`` largest logits.

    Args:
        logits (Tensor): Shape (B, K).
        labels (Tensor): Shape (B, ).
        topk (Sequence[int]): Values of k (capped at K).

    Returns:
        tuple[Tensor]: One scalar per k, in [0, 100].
    """
    ranks = logits.topk(min(max(topk), logits.shape[-1]), dim=-1).indices
    hits = ranks == labels.reshape(-1, 1)  # (B, min(max(topk), K))
    return tuple(hits[:, :min(k, logits.shape[-1])].any(dim=-1).float().mean() * 100
                 for k in topk)


@METRICS.register_module()
class Accuracy(BaseMetric):
    """Top-k accuracy (percent) over a dataset, as mmpretrain's ``Accuracy``.

    Reads the ``pred_score`` and ``gt_label`` of the predicted data samples;
    k larger than the number of classes counts every image as correct.
    Results are named ``top{k}`` under the prefix, e.g. ``accuracy/top1``.

    Args:
        topk (int | Sequence[int]): Values of k. Default: (1, ).
        thrs (float | None): Score threshold; only 0 or None (softmax scores
            are positive, so both count every top-k hit). Default: 0.
        collect_device (str): ``'cpu'`` or ``'gpu'``. Default: ``'cpu'``.
        prefix (str, optional): Metric name prefix. Default: ``'accuracy'``.
    """
    default_prefix: Optional[str] = 'accuracy'

    def __init__(self, topk: Union[int, Sequence[int]] = (1, ),
                 thrs: Optional[float] = 0., collect_device: str = 'cpu',
                 prefix: Optional[str] = None):
        super().__init__(collect_device=collect_device, prefix=prefix)
        topk = (topk, ) if isinstance(topk, int) else tuple(topk)
        if not topk or any(not isinstance(k, int) or k < 1 for k in topk):
            raise ValueError(f'topk={topk!r} must be positive ints.')
        if thrs not in (0, None):
            raise ValueError(f'thrs={thrs!r} is not supported; expected 0. or None.')
        self.topk = topk

    def process(self, data_batch, data_samples: Sequence[dict]) -> None:
        for sample in data_samples:
            self.results.append(dict(
                score=torch.as_tensor(sample['pred_score']).detach().cpu(),
                label=int(torch.as_tensor(sample['gt_label']).reshape(-1)[0])))

    def compute_metrics(self, results: List[dict]) -> Dict[str, float]:
        scores = torch.stack([r['score'] for r in results])  # (N, K)
        labels = torch.tensor([r['label'] for r in results])  # (N, )
        values = topk_accuracy(scores, labels, self.topk)
        return {f'top{k}': float(v) for k, v in zip(self.topk, values)}
