"""Small SOFT and UFO-ViT backbones the sync and compile tests share,
with the batch of two valid regions the configs' data preprocessors give."""
from mmsoft.openmmlab import SOFT, UFOViT

SMALL_SOFT = dict(embed_dims=[32, 64, 160, 256], num_heads=[1, 2, 5, 8],
                  depths=[1, 1, 1, 1])
# 'newton': what a GPU runs for 'newton_closed_form' too (CLOSED_FORM_DEVICES:
# the eigendecomposition, whose backward gathers the close eigenvalue pairs,
# runs on the CPU only). 'exact' is left out: torch's LAPACK calls check
# their results on the host.
BACKBONES = {
    'soft++-newton': lambda: SOFT(SMALL_SOFT, variant='soft++', solver='newton',
                                  drop_path_rate=0.),
    'soft-newton': lambda: SOFT(SMALL_SOFT, variant='soft', solver='newton',
                                drop_path_rate=0.),
    'ufo-vit': lambda: UFOViT(dict(embed_dims=48, depth=4, num_heads=2),
                              drop_path_rate=0.),
}
#: Images of (64, 96) in a batch of two with these valid regions.
IMAGE_SIZE = (64, 96)
VALID_SHAPES = [(64, 96), (48, 64)]
