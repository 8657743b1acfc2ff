# A control for tools/analysis/compare_backbones.py's probe of PVTv2-b2-li:
# the PVTv2-b1 peer (mask-rcnn_pvtv2-b1_fpn_demo.py) at PVTv2-b2-li's depths
# 3-4-6-3, i.e. mmdet's PVTv2-b2. It differs from timm's pvt_v2_b2_li only
# in the keys' reduction (strided convolutions, not pooling to 7x7) and the
# MLP's ReLU, so the two together tell timm's implementation and the
# linear attention apart from the depth. Probe only: not a row of the table.
_base_ = ['./mask-rcnn_pvtv2-b1_fpn_demo.py']

model = dict(backbone=dict(num_layers=[3, 4, 6, 3]))
