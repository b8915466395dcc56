"""Every registered encoder: shapes, gradients, candidate equivariance and independence, sizes."""
from __future__ import annotations

import pytest
import torch

from rpm_lib.encoders import Encoder, create_encoder, list_encoders

IMAGE_SIZE = 80
BATCH = 2

#: Reference sizes at 80 px (the MLCL paper's encoders as counted from the public definitions).
REFERENCE_PARAMETERS: dict[str, int] = {
    "scl": 529_000,
    "copinet": 1_690_000,
    "hrinet": 13_200_000,
    "wren": 1_220_000,
    # The official predrnet_raven (3 extra stages, classifier_hidreduce 4) has 1,277,889; its last layer,
    # Linear(256, 1), is rpm_lib's scoring head (257).
    "predrnet": 1_277_632,
}
REFERENCE_EMBEDDING_DIM: dict[str, int] = {"scl": 400, "copinet": 256, "hrinet": 1024, "wren": 256, "predrnet": 256}


def build(name: str, **kwargs: object) -> Encoder:
    torch.manual_seed(0)
    return create_encoder(name, image_size=IMAGE_SIZE, **kwargs)


def random_panels(seed: int, batch: int = BATCH) -> torch.Tensor:
    return torch.rand(batch, 16, IMAGE_SIZE, IMAGE_SIZE, generator=torch.Generator().manual_seed(seed))


def count_parameters(module: torch.nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


@pytest.fixture(scope="module", params=list_encoders())
def encoder_name(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture(scope="module")
def eval_encoder(encoder_name: str) -> Encoder:
    encoder = build(encoder_name)
    # One train-mode pass on data moves BatchNorm running statistics away from their (0, 1) start.
    with torch.no_grad():
        encoder(random_panels(99))
    return encoder.eval()


def test_forward_backward_shapes_and_finiteness(encoder_name: str) -> None:
    encoder = build(encoder_name).train()
    embeddings = encoder(random_panels(0))
    assert embeddings.shape == (BATCH, 8, encoder.embedding_dim)
    assert torch.isfinite(embeddings).all()
    (embeddings * torch.randn_like(embeddings)).sum().backward()
    grads = [p.grad for p in encoder.parameters()]
    assert all(g is not None and torch.isfinite(g).all() for g in grads), "a parameter got no / a non-finite gradient"
    assert sum(int(g.abs().sum() > 0) for g in grads) >= 0.9 * len(grads)


def test_permuting_candidates_permutes_embeddings(eval_encoder: Encoder) -> None:
    panels = random_panels(1)
    order = torch.tensor([3, 0, 7, 1, 6, 2, 5, 4])
    permuted = torch.cat([panels[:, :8], panels[:, 8:][:, order]], dim=1)
    with torch.no_grad():
        expected = eval_encoder(panels)[:, order]
        actual = eval_encoder(permuted)
    torch.testing.assert_close(actual, expected, rtol=1e-4, atol=1e-5)


def test_changing_one_candidate_matches_the_coupling_flag(eval_encoder: Encoder) -> None:
    panels = random_panels(2)
    changed = panels.clone()
    changed[:, 8 + 5] = torch.rand(BATCH, IMAGE_SIZE, IMAGE_SIZE, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        before, after = eval_encoder(panels), eval_encoder(changed)
    others = [k for k in range(8) if k != 5]
    assert not torch.allclose(before[:, 5], after[:, 5], atol=1e-6), "the changed completion must change"
    if eval_encoder.couples_candidates:
        assert not torch.allclose(before[:, others], after[:, others], atol=1e-6), "declared coupled but is not"
    else:
        torch.testing.assert_close(after[:, others], before[:, others], rtol=1e-5, atol=1e-6)


def test_changing_the_context_changes_every_completion(eval_encoder: Encoder) -> None:
    panels = random_panels(4)
    changed = panels.clone()
    changed[:, 0] = 1.0 - changed[:, 0]
    with torch.no_grad():
        before, after = eval_encoder(panels), eval_encoder(changed)
    assert ((before - after).abs().amax(dim=-1) > 1e-6).all()


def test_parameter_count_and_embedding_dim(encoder_name: str) -> None:
    assert encoder_name in REFERENCE_PARAMETERS, f"add a reference parameter count for {encoder_name!r}"
    encoder = build(encoder_name)
    assert count_parameters(encoder) == pytest.approx(REFERENCE_PARAMETERS[encoder_name], rel=0.02)
    assert encoder.embedding_dim == REFERENCE_EMBEDDING_DIM[encoder_name]


def test_same_seed_same_weights(encoder_name: str) -> None:
    first, second = build(encoder_name).state_dict(), build(encoder_name).state_dict()
    assert all(torch.equal(first[key], second[key]) for key in first)


@pytest.mark.parametrize(
    "panels, message",
    [
        (torch.rand(2, 15, IMAGE_SIZE, IMAGE_SIZE), "must have shape"),
        (torch.rand(2, 16, 64, 64), "must have shape"),
        (torch.rand(16, IMAGE_SIZE, IMAGE_SIZE), "must have shape"),
        (torch.zeros(2, 16, IMAGE_SIZE, IMAGE_SIZE, dtype=torch.uint8), "floating point"),
    ],
)
def test_bad_panels_raise(eval_encoder: Encoder, panels: torch.Tensor, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        eval_encoder(panels)


def test_hrinet_resnet18_backbone() -> None:
    """The MLCL release's HriNet: three ResNet-18s, 46.7 M parameters, same embedding shape."""
    encoder = build("hrinet", backbone="resnet18").eval()
    assert count_parameters(encoder) == pytest.approx(46_700_000, rel=0.02)
    with torch.no_grad():
        embeddings = encoder(random_panels(5, batch=1))
    assert embeddings.shape == (1, 8, 1024) and torch.isfinite(embeddings).all()


def test_hrinet_unknown_backbone() -> None:
    with pytest.raises(ValueError, match="unknown backbone"):
        create_encoder("hrinet", backbone="vgg")
