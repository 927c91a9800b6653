"""Stacked frames stored once (datamodules/frames.py), on real Mario play: the stacks a replay buffer hands back are
exactly the ones written, in whatever order the batches arrive, at about one frame per transition."""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict
from torchrl.data import LazyTensorStorage, TensorDictReplayBuffer
from torchrl.envs import MultiStepTransform

from datamodules.frames import FrameStackStore
from envs.mario.env import MarioEnv


@pytest.fixture(scope="module")
def play():
    """Two emulators (small frames, to keep the test quick) playing 90 steps of random buttons, episodes ending and
    restarting on the way: ``[envs, steps]`` transitions in time order."""
    env = MarioEnv(num_envs=2, size=40, frame_stack=4, stuck_steps=15, seed=3)
    generator = torch.Generator().manual_seed(0)
    td, steps = env.reset(), []
    for _ in range(90):
        td["action"] = torch.randint(0, 12, (2,), generator=generator)
        out, td = env.step_and_maybe_reset(td)
        steps.append(out.clone())
    env.close()
    batch = torch.stack(steps, 1)  # [envs, steps]
    assert int(batch["next", "done"].sum()) >= 4  # episodes end and restart inside the play
    return batch


def buffer(capacity: int, frames: int, host_copy: bool | None = None, device: str = "cpu") -> TensorDictReplayBuffer:
    store = FrameStackStore(frames, (4, 40, 40), reuse_window=frames // 4, host_copy=host_copy, device=device)
    return TensorDictReplayBuffer(storage=LazyTensorStorage(capacity, device=device), transform=store, batch_size=8)


ON_A_GPU = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@pytest.mark.slow
@pytest.mark.parametrize(
    ("host_copy", "device"),
    [(False, "cpu"), (True, "cpu"), pytest.param(None, "cuda", marks=ON_A_GPU)],
    ids=["ring", "host_copy_of_the_ring", "ring_on_a_gpu"],
)
def test_sampled_stacks_equal_the_written_ones_in_any_arrival_order(play, host_copy, device):
    # host_copy: the path a ring on a GPU takes (bookkeeping on a host copy, new frames sent once per call), on the CPU;
    # on a GPU, the batches arrive from the host, as asynchronous workers deliver them, and are stored on the device
    rb = buffer(capacity=1000, frames=1000, host_copy=host_copy, device=device)
    # Batches of 10 steps of one environment, arriving interleaved as worker processes deliver them.
    pieces = [play[env, start : start + 10] for start in range(0, 90, 10) for env in (1, 0)]
    for piece in pieces:
        rb.extend(piece.select("observation", "action", ("next", "observation"), ("next", "reward")))
    written = torch.cat(pieces)
    stored = rb[torch.arange(len(rb))].cpu()
    assert torch.equal(stored["observation"], written["observation"])
    assert torch.equal(stored["next", "observation"], written["next", "observation"])
    assert torch.equal(stored["action"], written["action"])
    store = rb._transform[0]
    transitions, episodes = written.shape[0], int(written["next", "done"].sum()) + 2
    # One new frame per transition, plus one per episode start (its stack repeats one frame), nothing else: the
    # stacks that continue a batch of another worker's delivery were matched by content.
    assert int(store.written) == transitions + episodes
    assert store.frames.nbytes == 1000 * 40 * 40 and "observation" not in rb.storage._storage


def test_an_episode_continued_after_many_other_workers_batches_still_writes_one_frame_a_step(play):
    # Environment 0's batches with 90 transitions of another worker between them (14 workers of 64-step batches put
    # 832 between a worker's consecutive batches; the matching window is 8,192 stacks, found by fingerprint).
    rb = buffer(capacity=1000, frames=1000)
    pieces = [play[0, :20], play[1], play[0, 20:]]
    for piece in pieces:
        rb.extend(piece.select("observation", "action", ("next", "observation"), ("next", "reward")))
    written = torch.cat(pieces)
    assert torch.equal(rb[torch.arange(len(rb))]["observation"], written["observation"])
    episodes = int(written["next", "done"].sum()) + 2
    assert int(rb._transform[0].written) == written.shape[0] + episodes  # the continuation was matched


def test_n_step_next_observations_are_rebuilt_too(play):
    rb = buffer(capacity=1000, frames=1000)
    n_step = MultiStepTransform(3, 0.9, done_keys=[])
    sums = []
    for start in range(0, 90, 15):
        out = n_step.inv(play[:, start : start + 15].select("observation", "action", "next").clone())
        if out is not None:
            sums.append(out.reshape(-1))
            rb.extend(sums[-1].select("observation", "action", ("next", "observation"), ("next", "reward")))
    written = torch.cat(sums)
    stored = rb[torch.arange(len(rb))]
    assert torch.equal(stored["next", "observation"], written["next", "observation"])
    assert torch.equal(stored["observation"], written["observation"])


def test_a_ring_too_small_for_the_buffer_is_an_error_naming_the_option_not_a_wrong_picture(play):
    rb = buffer(capacity=1000, frames=40)
    rb.extend(play.reshape(-1).select("observation", "action", ("next", "observation")))
    with pytest.raises(RuntimeError, match=r"data.frame_capacity \(40 frames\) is too small"):
        rb[torch.arange(len(rb))]
    assert rb[torch.arange(len(rb) - 20, len(rb))]["observation"].shape == (20, 4, 40, 40)  # recent ones still read


def test_a_stack_seen_long_ago_is_written_again_not_pointed_at_frames_the_ring_will_overwrite_first():
    # A deterministic game replays the same stacks in later episodes (the shipped Mario training starts every episode
    # where the stage does). A stack equal to a next stack written long ago must not take that one's frame ids: the
    # new transition would outlive those frames in the ring, and chains of such matches (a 24-minute Mario run hit
    # one) end with the buffer pointing at overwritten frames.
    generator = torch.Generator().manual_seed(0)

    def episode(steps: int) -> TensorDict:
        frames = torch.randint(0, 256, (steps + 4, 40, 40), dtype=torch.uint8, generator=generator)
        stacks = torch.stack([frames[t : t + 4] for t in range(steps + 1)])
        return TensorDict({"observation": stacks[:-1], ("next", "observation"): stacks[1:]}, batch_size=[steps])

    store = FrameStackStore(125, (4, 40, 40), reuse_window=25)  # a buffer of 100 transitions, 1.25 frames each
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(100), transform=store, batch_size=8)
    seen = episode(1)
    rb.extend(seen)
    rb.extend(episode(80))  # 85 frames later the first episode's next stack is still in the ring...
    again = seen["next", "observation"]
    replay = TensorDict({"observation": again, ("next", "observation"): again.roll(-1, 1)}, batch_size=[1])
    rb.extend(replay)  # ...and a later episode shows it again (stored at slot 81)
    rb.extend(episode(40))  # the ring moves past the first episode's frames while slot 81 is still stored
    stored = rb[torch.arange(len(rb))]  # every stored transition's frames read back (none overwritten)
    assert torch.equal(stored["observation"][81], again[0])
    assert torch.equal(stored["next", "observation"][81], replay["next", "observation"][0])


def test_a_small_buffer_fed_by_interleaved_workers_still_matches_their_continuations():
    # The store as ReplayDataModule builds it for 1,000 transitions, fed as two workers of 8 environments x 16 steps
    # deliver: an environment's episode continues 240 frames after its previous step. A ring with only a quarter of the
    # buffer to spare (125 frames for reuse) missed those continuations, wrote whole stacks (1.5 frames a transition)
    # and overwrote frames the buffer still used.
    generator = torch.Generator().manual_seed(0)
    store = FrameStackStore.for_buffer(1000, (8, 16, 16))
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(1000), transform=store, batch_size=8)
    stacks = {
        stream: torch.randint(0, 256, (8, 16, 16), dtype=torch.uint8, generator=generator) for stream in range(16)
    }
    transitions = 0
    for _ in range(20):
        for worker in range(2):
            pieces = []
            for stream in range(worker * 8, worker * 8 + 8):
                observations = [stacks[stream]]
                for _ in range(16):
                    new = torch.randint(0, 256, (1, 16, 16), dtype=torch.uint8, generator=generator)
                    observations.append(torch.cat((observations[-1][1:], new)))
                stacks[stream] = observations[-1]
                following = torch.stack(observations)
                pieces.append(TensorDict({"observation": following[:-1], ("next", "observation"): following[1:]}, [16]))
            rb.extend(torch.cat(pieces))
            transitions += 128
    assert int(store.written) == transitions + 16 * 8  # one frame a transition, plus each stream's first stack
    assert rb[torch.arange(len(rb))]["observation"].shape == (1000, 8, 16, 16)  # no stored frame was overwritten


def test_a_loaded_state_continues_as_the_store_it_came_from_with_a_host_copy(play):
    """A ring with a host copy (the GPU's path) loaded from a state: its host copy follows, so the next batches match
    their continuations in it and write what the store the state came from writes."""
    pieces = [play[env, start : start + 10] for start in range(0, 90, 10) for env in (1, 0)]
    keys = ("observation", "action", ("next", "observation"))
    first, resumed = buffer(1000, 1000, host_copy=True), buffer(1000, 1000, host_copy=True)
    for piece in pieces[:8]:
        first.extend(piece.select(*keys))
    resumed.load_state_dict(first.state_dict())
    for piece in pieces[8:]:
        first.extend(piece.select(*keys))
        resumed.extend(piece.select(*keys))
    store, continued = first._transform[0], resumed._transform[0]
    assert int(continued.written) == int(store.written) < 2 * len(first)  # continuations matched, not rewritten
    assert torch.equal(
        resumed[torch.arange(len(resumed))]["next", "observation"], torch.cat(pieces)["next", "observation"]
    )
