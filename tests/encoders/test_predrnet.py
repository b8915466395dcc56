"""PredRNet's own options: the column pass, the classifier width, the number of reasoning blocks, bad values."""
from __future__ import annotations

import pytest
import torch

from rpm_lib.encoders import create_encoder
from rpm_lib.encoders.predrnet import COLUMN_ORDER

IMAGE_SIZE = 32


def panels(seed: int, batch: int = 2) -> torch.Tensor:
    return torch.rand(batch, 16, IMAGE_SIZE, IMAGE_SIZE, generator=torch.Generator().manual_seed(seed))


def transposed_context(x: torch.Tensor) -> torch.Tensor:
    """The 3x3 context read column by column (the missing cell stays last); choices unchanged."""
    return torch.cat([x[:, list(COLUMN_ORDER)], x[:, 8:]], dim=1)


def eval_pair() -> tuple[torch.nn.Module, torch.nn.Module]:
    """Rows only and rows + columns, with the same weights and BatchNorm statistics, in eval mode."""
    torch.manual_seed(0)
    rows = create_encoder("predrnet", image_size=IMAGE_SIZE, num_extra_stages=2)
    with torch.no_grad():
        rows(panels(9, batch=4))
    both = create_encoder("predrnet", image_size=IMAGE_SIZE, num_extra_stages=2, column_pass=True)
    both.load_state_dict(rows.state_dict())
    return rows.eval(), both.eval()


def test_the_column_pass_adds_the_transposed_context_s_hidden_vector() -> None:
    rows, both = eval_pair()
    x = panels(1)
    with torch.no_grad():
        torch.testing.assert_close(both(x), rows(x) + rows(transposed_context(x)), rtol=1e-5, atol=1e-5)
        # reading rows and columns makes the embedding blind to which way the context is laid out
        torch.testing.assert_close(both(transposed_context(x)), both(x), rtol=1e-5, atol=1e-5)
        assert not torch.allclose(rows(transposed_context(x)), rows(x), atol=1e-4)


@pytest.mark.parametrize("reduce, dim", [(1, 1024), (4, 256), (8, 128)])
def test_the_classifier_width_is_the_embedding_size(reduce: int, dim: int) -> None:
    encoder = create_encoder("predrnet", image_size=IMAGE_SIZE, classifier_hidden_reduce=reduce).eval()
    assert encoder.embedding_dim == dim
    with torch.no_grad():
        assert encoder(panels(2)).shape == (2, 8, dim)


def test_each_reasoning_block_adds_the_same_parameters() -> None:
    sizes = [sum(p.numel() for p in create_encoder("predrnet", image_size=IMAGE_SIZE,
                                                   num_extra_stages=n).parameters()) for n in (0, 1, 3)]
    per_block = sizes[1] - sizes[0]
    # pconv 32x32x8 + conv1 32x128x9 + conv2 128x32x9 + shortcut 32x32, and their BatchNorms (2 x channels each)
    assert per_block == 8192 + 36864 + 36864 + 1024 + 2 * (32 + 128 + 32 + 32)
    assert sizes[2] - sizes[0] == 3 * per_block


def test_embeddings_are_non_negative_and_dropout_only_acts_in_training() -> None:
    encoder = create_encoder("predrnet", image_size=IMAGE_SIZE, classifier_dropout=0.5)
    x = panels(3)
    with torch.no_grad():
        assert (encoder(x) >= 0).all()
        encoder.eval()
        torch.testing.assert_close(encoder(x), encoder(x))


@pytest.mark.parametrize("kwargs, message", [
    ({"image_size": 8}, "image_size must be at least 16"),
    ({"num_extra_stages": -1}, "num_extra_stages >= 0"),
    ({"block_dropout": 1.0}, "block_dropout must be in"),
    ({"classifier_dropout": -0.1}, "classifier_dropout must be in"),
    ({"classifier_hidden_reduce": 0}, "classifier_hidden_reduce must be in"),
])
def test_bad_options_say_which(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        create_encoder("predrnet", **{"image_size": IMAGE_SIZE, **kwargs})
