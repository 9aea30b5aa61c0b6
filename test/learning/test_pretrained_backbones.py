"""Pretrained camera backbones: published key layouts, weights files, frozen and fine-tuned.

The checkpoints are written here with random values in the published files' exact key
names and shapes (spelled out below from torchvision's resnet.py and facebookresearch/
dinov2's hub model, independently of the package's modules), so a strict load proves the
architectures match the real files without downloading them.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from fed_ros.core.data import episode as ep
from fed_ros.learning.backbones.dinov2 import DinoV2ViTS14
from fed_ros.learning.backbones.files import find_weights, load_backbone, read_weights
from fed_ros.learning.backbones.resnet import ResNet18
from fed_ros.learning.backbones.trunk import PretrainedTrunk
from fed_ros.learning.configuration_policy import PolicyConfig
from fed_ros.learning.dataset import DemoDataset, synthetic_episodes
from fed_ros.learning.modeling_policy import build_policy
from fed_ros.learning.weights import load_state_dict_into, policy_to_state_dict

pytestmark = pytest.mark.usefixtures("torch_one_thread")

TINY = dict(
    kind="image",
    embed_dim=32,
    window=3,
    transformer_layers=1,
    transformer_heads=2,
    transformer_ff=64,
    dropout=0.0,
    text_dim=64,
    conv_channels=(8, 16),
    num_keypoints=8,
    random_shift=0,
)
# Small frames keep the backbones' forward cheap: ResNet-18 at 64 px (a 2x2 final map),
# DINOv2 at 28 px (a 2x2 patch grid, so the 37x37 positional embedding is interpolated).
SIZES = {"resnet18_imagenet": 64, "dinov2_vits14": 28}


def _batchnorm(out: dict, name: str, channels: int) -> None:
    for leaf in ("weight", "bias", "running_mean", "running_var"):
        out[f"{name}.{leaf}"] = (channels,)
    out[f"{name}.num_batches_tracked"] = ()  # int64 in torchvision's files


def torchvision_resnet18_layout() -> dict[str, tuple[int, ...]]:
    """Key -> shape of torchvision's resnet18 state dict (resnet18-f37072fd.pth)."""
    out: dict[str, tuple[int, ...]] = {"conv1.weight": (64, 3, 7, 7)}
    _batchnorm(out, "bn1", 64)
    prev = 64
    for stage, width in enumerate((64, 128, 256, 512), start=1):
        for block in (0, 1):
            name = f"layer{stage}.{block}"
            out[f"{name}.conv1.weight"] = (width, prev if block == 0 else width, 3, 3)
            _batchnorm(out, f"{name}.bn1", width)
            out[f"{name}.conv2.weight"] = (width, width, 3, 3)
            _batchnorm(out, f"{name}.bn2", width)
            if stage > 1 and block == 0:
                out[f"{name}.downsample.0.weight"] = (width, prev, 1, 1)
                _batchnorm(out, f"{name}.downsample.1", width)
        prev = width
    out["fc.weight"] = (1000, 512)
    out["fc.bias"] = (1000,)
    return out


def hub_dinov2_vits14_layout() -> dict[str, tuple[int, ...]]:
    """Key -> shape of torch.hub's dinov2_vits14 state dict (dinov2_vits14_pretrain.pth)."""
    d = 384
    out: dict[str, tuple[int, ...]] = {
        "cls_token": (1, 1, d),
        "pos_embed": (1, 1 + 37 * 37, d),
        "mask_token": (1, d),
        "patch_embed.proj.weight": (d, 3, 14, 14),
        "patch_embed.proj.bias": (d,),
    }
    for i in range(12):
        b = f"blocks.{i}"
        out |= {
            f"{b}.norm1.weight": (d,),
            f"{b}.norm1.bias": (d,),
            f"{b}.attn.qkv.weight": (3 * d, d),
            f"{b}.attn.qkv.bias": (3 * d,),
            f"{b}.attn.proj.weight": (d, d),
            f"{b}.attn.proj.bias": (d,),
            f"{b}.ls1.gamma": (d,),
            f"{b}.norm2.weight": (d,),
            f"{b}.norm2.bias": (d,),
            f"{b}.mlp.fc1.weight": (4 * d, d),
            f"{b}.mlp.fc1.bias": (4 * d,),
            f"{b}.mlp.fc2.weight": (d, 4 * d),
            f"{b}.mlp.fc2.bias": (d,),
            f"{b}.ls2.gamma": (d,),
        }
    out["norm.weight"] = (d,)
    out["norm.bias"] = (d,)
    return out


LAYOUTS = {
    "resnet18_imagenet": torchvision_resnet18_layout,
    "dinov2_vits14": hub_dinov2_vits14_layout,
}


def random_state(layout: dict[str, tuple[int, ...]], seed: int) -> dict[str, torch.Tensor]:
    """Random tensors in a published layout (variances positive, counters int64)."""
    gen = torch.Generator().manual_seed(seed)
    out = {}
    for key, shape in layout.items():
        if key.endswith("num_batches_tracked"):
            out[key] = torch.tensor(100, dtype=torch.int64)
        elif key.endswith("running_var"):
            out[key] = torch.rand(shape, generator=gen) + 0.5
        else:
            out[key] = torch.randn(shape, generator=gen) * 0.05
    return out


@pytest.fixture(scope="module")
def weights_files(tmp_path_factory) -> dict[str, str]:
    """One random checkpoint per backbone, saved as torch.save'd .pth like the published."""
    root = tmp_path_factory.mktemp("published")
    files = {}
    for seed, (name, layout) in enumerate(LAYOUTS.items()):
        path = root / {"resnet18_imagenet": "resnet18-f37072fd.pth"}.get(
            name, "dinov2_vits14_pretrain.pth"
        )
        torch.save(random_state(layout(), seed), path)
        files[name] = str(path)
    return files


def policy_cfg(name: str, path: str, **kw) -> PolicyConfig:
    return PolicyConfig(
        **TINY, image_size=SIZES[name], vision_backbone=name, backbone_weights=path, **kw
    )


def image_batch(cfg: PolicyConfig, n: int = 4) -> dict:
    data = DemoDataset(synthetic_episodes(2, 5, "image", image_size=cfg.image_size), cfg)
    return data.torch_batch(np.arange(n))


# -- architectures and files -----------------------------------------------------------


def test_published_layouts_have_the_published_parameter_counts():
    def params(layout):
        stats = ("running_mean", "running_var", "num_batches_tracked")
        return sum(int(np.prod(s)) for k, s in layout.items() if not k.endswith(stats))

    assert params(torchvision_resnet18_layout()) == 11_689_512  # torchvision's resnet18
    assert params(hub_dinov2_vits14_layout()) == 22_056_576  # DINOv2 ViT-S/14, "21M"
    assert sum(p.numel() for p in ResNet18().parameters()) == 11_689_512
    assert sum(p.numel() for p in DinoV2ViTS14().parameters()) == 22_056_576


@pytest.mark.parametrize("name", list(LAYOUTS))
def test_published_file_loads_strictly_with_every_value(name, weights_files):
    module = load_backbone(name, weights_files[name])
    want = read_weights(weights_files[name])
    own = module.state_dict()
    # Every tensor arrived except those the feature map never uses (dropped after the load).
    unused = {"resnet18_imagenet": ("fc.weight", "fc.bias"), "dinov2_vits14": ("mask_token",)}
    assert set(want) - set(own) - set(unused[name]) == {
        k for k in want if k.endswith("num_batches_tracked")
    }
    for key, value in own.items():
        assert torch.equal(value, want[key]), key


def test_safetensors_file_and_file_without_batch_counters_load(weights_files, tmp_path):
    state = read_weights(weights_files["resnet18_imagenet"])
    old = {k: v for k, v in state.items() if not k.endswith("num_batches_tracked")}
    path = tmp_path / "resnet18.safetensors"
    save_file(old, str(path))
    module = load_backbone("resnet18_imagenet", path)
    assert torch.equal(module.layer4[1].conv2.weight, state["layer4.1.conv2.weight"])


@pytest.mark.parametrize(
    "edit,match",
    [
        (
            lambda s: s.__setitem__("layer3.0.conv1.weight", torch.zeros(256, 128, 1, 1)),
            r"'layer3\.0\.conv1\.weight' has shape \(256, 128, 1, 1\), expected \(256, 128, 3, 3\)",
        ),
        (
            lambda s: s.pop("layer4.1.bn2.running_var"),
            r"missing tensor 'layer4\.1\.bn2\.running_var'",
        ),
        (
            lambda s: s.__setitem__("head.weight", torch.zeros(3)),
            r"unexpected tensor 'head\.weight'",
        ),
    ],
)
def test_wrong_file_is_rejected_naming_the_tensor(weights_files, tmp_path, edit, match):
    state = dict(read_weights(weights_files["resnet18_imagenet"]))
    edit(state)
    path = tmp_path / "bad.pth"
    torch.save(state, path)
    with pytest.raises(ValueError, match=match):
        load_backbone("resnet18_imagenet", path)


def test_a_file_that_is_not_a_state_dict_is_rejected(tmp_path):
    path = tmp_path / "list.pth"
    torch.save([torch.zeros(1)], path)
    with pytest.raises(ValueError, match="not a state dict"):
        load_backbone("resnet18_imagenet", path)


def test_missing_file_is_one_error_naming_path_and_source(tmp_path):
    path = tmp_path / "nowhere" / "resnet18.pth"
    with pytest.raises(FileNotFoundError) as err:
        build_policy(policy_cfg("resnet18_imagenet", str(path)))
    msg = str(err.value)
    assert str(path) in msg
    assert "https://download.pytorch.org/models/resnet18-f37072fd.pth" in msg
    assert "nothing is downloaded" in msg


def test_hub_cache_is_read_when_no_path_is_given(weights_files, tmp_path, monkeypatch):
    monkeypatch.setenv("TORCH_HOME", str(tmp_path))
    cached = tmp_path / "hub" / "checkpoints" / "dinov2_vits14_pretrain.pth"
    with pytest.raises(FileNotFoundError) as err:
        find_weights("dinov2_vits14")
    assert str(cached) in str(err.value)
    url = "https://dl.fbaipublicfiles.com/dinov2/dinov2_vits14/dinov2_vits14_pretrain.pth"
    assert url in str(err.value)
    cached.parent.mkdir(parents=True)
    cached.write_bytes(open(weights_files["dinov2_vits14"], "rb").read())
    assert find_weights("dinov2_vits14") == cached
    assert build_policy(policy_cfg("dinov2_vits14", None)) is not None


def test_dinov2_position_embedding_is_resized_per_grid_keeping_row_order():
    vit = DinoV2ViTS14()
    rows = torch.arange(37.0)[:, None, None].expand(37, 37, 384)  # varies along rows only
    with torch.no_grad():
        vit.pos_embed[0, 1:] = rows.reshape(-1, 384)
        vit.pos_embed[0, 0] = -1.0
    assert vit.position_embedding(37, 37) is vit.pos_embed  # the pretraining grid, as is
    small = vit.position_embedding(3, 5)
    assert small.shape == (1, 1 + 15, 384)
    assert torch.equal(small[0, 0], vit.pos_embed[0, 0])
    grid = small[0, 1:, 0].reshape(3, 5)
    assert torch.allclose(grid, grid[:, :1].expand(3, 5), atol=1e-4)  # constant along columns
    assert bool((grid[1:, 0] > grid[:-1, 0] + 5).all())  # rows keep order and span the grid
    assert vit(torch.rand(1, 3, 42, 70)).shape == (1, 384, 3, 5)


def test_trunk_normalises_and_resizes_for_its_backbone(weights_files):
    trunk = PretrainedTrunk("dinov2_vits14", weights_files["dinov2_vits14"], 28)
    x = torch.rand(2, 3, 33, 33)
    with torch.no_grad():
        feats = trunk(x)
        resized = torch.nn.functional.interpolate(x, size=(28, 28), mode="bilinear", antialias=True)
        mean = torch.tensor([0.485, 0.456, 0.406])[:, None, None]
        std = torch.tensor([0.229, 0.224, 0.225])[:, None, None]
        direct = trunk.backbone((resized - mean) / std)
    assert feats.shape == (2, 384, 2, 2)
    assert torch.allclose(feats, direct, atol=1e-5)


# -- the policy ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kw,match",
    [
        (dict(vision_backbone="resnet50"), "vision_backbone.*'resnet50'"),
        (dict(backbone_weights="/x.pth"), "backbone_weights='/x.pth' needs a pretrained"),
        (dict(backbone_image_size=84), "backbone_image_size=84 needs a pretrained"),
        (dict(vision_backbone="dinov2_vits14", backbone_image_size=90), "multiple of 14.*90"),
        (dict(vision_backbone="resnet18_imagenet", backbone_image_size=16), ">= 32, got 16"),
        (dict(vision_backbone="resnet18_imagenet", freeze_backbone=1), "freeze_backbone.*1"),
        (dict(backbone_cache_frames=-1), "backbone_cache_frames.*-1"),
        (dict(vision_backbone="resnet18_imagenet", kind="lowdim"), "needs kind='image'"),
    ],
)
def test_config_rejects_bad_backbone_settings_naming_them(kw, match):
    with pytest.raises(ValueError, match=match):
        PolicyConfig(**{"kind": "image", **kw})


def test_config_resolves_backbone_input_size_and_round_trips():
    assert PolicyConfig(kind="image").backbone_image_size is None  # scratch: unchanged
    dino = PolicyConfig(kind="image", image_size=90, vision_backbone="dinov2_vits14")
    assert dino.backbone_image_size == 84  # nearest multiple of 14
    res = PolicyConfig(kind="image", vision_backbone="resnet18_imagenet", backbone_weights="w")
    assert res.backbone_image_size == 84
    assert PolicyConfig.from_dict(res.to_dict()) == res
    # Shifted frames would miss the frozen feature cache: no shift unless asked for.
    assert (res.random_shift, PolicyConfig(kind="image").random_shift) == (0, 4)
    tuned = PolicyConfig(kind="image", vision_backbone="dinov2_vits14", freeze_backbone=False)
    assert tuned.random_shift == 4
    explicit = PolicyConfig(kind="image", vision_backbone="dinov2_vits14", random_shift=2)
    assert explicit.random_shift == 2


@pytest.mark.parametrize("name", list(LAYOUTS))
def test_frozen_backbone_is_cached_outside_the_state_dict_and_gets_no_grads(name, weights_files):
    cfg = policy_cfg(name, weights_files[name])
    model = build_policy(cfg, seed=0)
    sd = policy_to_state_dict(model)
    assert not any("trunk" in k or "backbone" in k for k in sd)
    assert sum(v.size for v in sd.values()) < 100_000  # only the adapter onward federates
    frozen = model.agentview_encoder.frozen
    assert frozen is model.wrist_encoder.frozen  # one shared trunk and cache per process
    frozen.clear()
    batch = image_batch(cfg)
    loss, info = model(batch)
    misses = frozen.misses
    loss.backward()
    assert all(p.grad is None for p in frozen.trunk.parameters())
    assert model.agentview_encoder.adapter.weight.grad.abs().sum() > 0
    hits = frozen.hits
    again = model.features(batch)
    assert frozen.misses == misses and frozen.hits > hits  # every frame came from the cache
    for cam in ("agentview", "wrist"):
        assert torch.equal(again[cam], info["output"].features[cam])
    # The cached features are the trunk's own (to rounding: they were computed in batches
    # of other sizes, and the conv kernels block by batch size).
    x = torch.as_tensor(batch[ep.AGENTVIEW_IMAGE]).permute(0, 3, 1, 2).float() / 255.0
    with torch.no_grad():
        direct = frozen.trunk(x)
    assert torch.allclose(model.agentview_encoder.backbone_features(x), direct, atol=1e-5)


def test_frozen_cache_is_bounded_and_new_frames_miss(weights_files):
    cfg = policy_cfg("resnet18_imagenet", weights_files["resnet18_imagenet"])
    frozen = build_policy(cfg).agentview_encoder.frozen
    frozen.clear()
    x = torch.rand(3, 3, 64, 64)
    first = frozen(x)
    other = x.clone()
    other[1, 2, -1, -1] += 0.5  # one value of one frame, its last
    second = frozen(other)
    assert (frozen.misses, frozen.hits) == (3 + 1, 2)  # only the changed frame was encoded
    assert torch.equal(first[0], second[0]) and not torch.equal(first[1], second[1])
    frozen.cache_frames = 2
    frozen(torch.rand(1, 3, 64, 64))
    assert len(frozen._cache) == 2
    frozen.cache_frames = cfg.backbone_cache_frames


def test_copies_and_pickles_share_the_frozen_trunk(weights_files):
    import copy
    import pickle

    cfg = policy_cfg("resnet18_imagenet", weights_files["resnet18_imagenet"])
    model = build_policy(cfg)
    frozen = model.agentview_encoder.frozen
    assert copy.deepcopy(model).agentview_encoder.frozen is frozen
    assert build_policy(cfg).agentview_encoder.frozen is frozen
    # Unpickled in this process, the policy finds the same shared trunk again.
    assert pickle.loads(pickle.dumps(model)).wrist_encoder.frozen is frozen


@pytest.mark.parametrize(
    "name,first,last",
    [
        ("resnet18_imagenet", "conv1.weight", "layer4.1.conv2.weight"),
        ("dinov2_vits14", "pos_embed", "blocks.11.mlp.fc2.weight"),
    ],
)
def test_fine_tuned_backbone_trains_and_federates(name, first, last, weights_files):
    cfg = policy_cfg(name, weights_files[name], freeze_backbone=False)
    model = build_policy(cfg, seed=0)
    published = read_weights(weights_files[name])
    prefix = "agentview_encoder.trunk.backbone."
    sd = policy_to_state_dict(model)  # float-only: no int64 batch counters
    assert np.array_equal(sd[prefix + last], published[last].numpy())
    assert not any(k.endswith(("fc.weight", "mask_token", "num_batches_tracked")) for k in sd)
    loss, _ = model(image_batch(cfg))
    loss.backward()
    params = dict(model.named_parameters())
    for key in (first, last):
        assert params[prefix + key].grad.abs().sum() > 0, key
    twin = load_state_dict_into(build_policy(cfg, seed=1), sd)
    assert all(np.array_equal(v, sd[k]) for k, v in policy_to_state_dict(twin).items())


def test_frozen_backbone_trains_locally_in_a_round(weights_files):
    from fed_ros.learning.configuration_trainer import TrainerConfig
    from fed_ros.learning.trainer import initial_state_dict, train_local

    cfg = policy_cfg("resnet18_imagenet", weights_files["resnet18_imagenet"])
    start = initial_state_dict(cfg, seed=0)
    eps = synthetic_episodes(2, 5, "image", image_size=cfg.image_size)
    tc = TrainerConfig(device="cpu", progress=False, rank=8, max_steps=2, batch_size=4, lr=1e-2)
    result = train_local(start, eps, cfg, tc)
    assert list(result.params) == list(start)
    moved = [k for k in start if not np.array_equal(start[k], result.params[k])]
    assert any(k.startswith("agentview_encoder.adapter") for k in moved)


def test_scratch_default_is_unchanged():
    cfg = PolicyConfig(**TINY, image_size=32)
    assert cfg.vision_backbone == "scratch" and cfg.backbone_weights is None
    sd = policy_to_state_dict(build_policy(cfg, seed=0))
    assert "agentview_encoder.stem.0.weight" in sd
