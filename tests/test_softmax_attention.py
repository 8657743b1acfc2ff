""":class:`~mmsoft.models.soft.GlobalSoftmaxAttention` (SOFT's stage-4
softmax blocks) against softmax attention written out with the layer's own
projections."""
import torch

from mmsoft.models.soft import GlobalSoftmaxAttention


def test_global_attention_is_softmax_attention_of_every_token():
    torch.manual_seed(0)
    attention = GlobalSoftmaxAttention(embed_dims=8, num_heads=2)
    x = torch.randn(2, 5, 8)
    query = attention.q(x).reshape(2, 5, 2, 4).transpose(1, 2)  # (B, h, N, d)
    keys, values = attention.kv(x).reshape(2, 5, 2, 2, 4).permute(2, 0, 3, 1, 4)
    weights = (query @ keys.transpose(-2, -1) / 2).softmax(-1)  # (B, h, N, N)
    expected = attention.proj((weights @ values).transpose(1, 2).reshape(2, 5, 8))
    assert torch.allclose(attention(x), expected, atol=1e-6)
    # Padding left out: the masked token is attended by no one.
    mask = torch.tensor([[True] * 4 + [False], [True] * 5])
    masked = attention(x, key_mask=mask)
    shifted = x.clone()
    shifted[0, 4] += 10.
    assert torch.allclose(attention(shifted, key_mask=mask)[0, :4], masked[0, :4],
                          atol=1e-5)
    assert sorted(attention.state_dict()) == ['kv.bias', 'kv.weight', 'proj.bias',
                                              'proj.weight', 'q.bias', 'q.weight']
