"""Expert demonstrations: collected once and reused, keyed by their options, rebuilt when damaged, split 90/10."""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict

from envs.racing.demonstrations import DemonstrationDataModule
from envs.racing.env import RacingEnv
from envs.racing.expert import TimeOptimalExpert
from envs.testing.chain import ChainEnv


def small(tmp_path, **kwargs) -> DemonstrationDataModule:
    return DemonstrationDataModule(RacingEnv, **{"episodes": 6, "steps": 40, "root": str(tmp_path), **kwargs})


def test_default_collection_is_50k_expert_pairs(tmp_path):
    data = DemonstrationDataModule(RacingEnv, root=str(tmp_path))
    data.prepare_data()
    pairs = TensorDict.load_memmap(data.path)
    assert pairs.batch_size == torch.Size([50_000])
    # The stored actions are the expert's on the stored observations (it steers by them and the car's arc).
    expert = TimeOptimalExpert(RacingEnv())
    replayed = expert(pairs.select("observation", "arc").clone())["action"]
    torch.testing.assert_close(replayed, pairs["action"].clone())
    assert pairs["observation"][:, 0].abs().max() < 2.0  # the expert stays on the 4 m track


def test_a_second_run_reuses_the_collection(tmp_path, monkeypatch):
    small(tmp_path).prepare_data()
    again = small(tmp_path)

    def no_collection():
        raise AssertionError("collected again")

    monkeypatch.setattr(again, "collect", no_collection)
    again.prepare_data()
    again.setup("fit")
    assert len(again.train_set) + len(again.val_set) == 240


def test_changed_options_write_a_new_collection(tmp_path):
    base = small(tmp_path)
    for other in (
        small(tmp_path, steps=41),
        small(tmp_path, seed=1),
        DemonstrationDataModule(lambda **kw: RacingEnv(width=5.0, **kw), episodes=6, steps=40, root=str(tmp_path)),
        DemonstrationDataModule(lambda **kw: RacingEnv(crash=5.0, **kw), episodes=6, steps=40, root=str(tmp_path)),
    ):
        assert other.path != base.path
    assert small(tmp_path).path == base.path  # and the same options the same one


@pytest.mark.parametrize("damage", ["truncate", "remove_marker", "remove_file"])
def test_a_damaged_collection_is_collected_again(tmp_path, damage):
    data = small(tmp_path)
    data.prepare_data()
    original = TensorDict.load_memmap(data.path).clone()
    if damage == "truncate":
        action = data.path / "action.memmap"
        action.write_bytes(action.read_bytes()[:100])
    elif damage == "remove_marker":
        (data.path / "complete.json").unlink()
    else:
        (data.path / "observation.memmap").unlink()
    again = small(tmp_path)
    again.prepare_data()
    assert (TensorDict.load_memmap(again.path) == original).all()
    assert not list(tmp_path.glob("*.partial-*"))


def test_split_is_fixed_disjoint_and_ninety_ten(tmp_path):
    data = small(tmp_path, episodes=10, steps=50)
    data.prepare_data()
    data.setup("fit")
    assert (len(data.train_set), len(data.val_set)) == (450, 50)
    train_rows = {tuple(row.tolist()) for row in data.train_set.tensors[0]}
    assert not train_rows & {tuple(row.tolist()) for row in data.val_set.tensors[0]}
    other = small(tmp_path, episodes=10, steps=50)
    other.setup("fit")
    assert torch.equal(other.val_set.tensors[0], data.val_set.tensors[0])
    batch = next(iter(data.train_dataloader()))
    assert [t.shape for t in batch] == [torch.Size([256, 8]), torch.Size([256, 2])]


def test_bad_options_name_the_flag(tmp_path):
    with pytest.raises(ValueError, match="data.val_fraction"):
        small(tmp_path, val_fraction=0.0)
    with pytest.raises(ValueError, match="data.episodes"):
        small(tmp_path, episodes=0)
    with pytest.raises(ValueError, match="data.env ChainEnv"):
        DemonstrationDataModule(ChainEnv, root=str(tmp_path))
    with pytest.raises(FileNotFoundError, match="prepare_data"):
        small(tmp_path).setup("fit")


def test_action_noise_perturbs_the_driving_but_not_the_labels(tmp_path):
    clean, noisy = small(tmp_path), small(tmp_path, action_noise=(0.5, 0.05))
    assert noisy.path != clean.path
    clean_pairs, noisy_pairs = clean.collect(), noisy.collect()
    # The cars drive other states (the executed actions were perturbed)...
    assert not torch.allclose(clean_pairs["observation"], noisy_pairs["observation"])
    # ...and every label is still the expert's clean action on the state it was given.
    expert = TimeOptimalExpert(RacingEnv())
    relabelled = expert(noisy_pairs.select("observation", "arc").clone())["action"]
    torch.testing.assert_close(relabelled, noisy_pairs["action"])
    with pytest.raises(ValueError, match="data.action_noise"):
        small(tmp_path, action_noise=(0.5,))
