"""SAC on the racing env: the actor's start from behaviour cloning, the one-command pipeline, full resume, the
compiled and bf16 updates, the soft target update, export and validate."""

from __future__ import annotations

import copy
import json
import math
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import yaml
from tensordict import TensorDict
from torchrl.envs.utils import ExplorationType, set_exploration_type
from torchrl.modules import TanhNormal

from app.seeds import read_curve
from app.stages import MARKER, stage_folder
from datamodules.evaluation import episode_statistics
from envs.racing.env import RacingEnv
from modules.gaussian import tanh_gaussian_sample
from modules.sac import SAC, ActorOptions, BCTermOptions, CriticOptions
from tests.app.test_cli import run_app
from tests.helpers import RESEEDED, ROOT, assert_same_losses_and_gradients, fit, weights, write_config

ENV = RacingEnv(curvature_ahead=[5, 15, 30])
SPECS = {"observation_spec": ENV.observation_spec[0], "action_spec": ENV.action_spec[0]}
SHORT_EPISODES = {"max_steps": 200}  # evaluation episodes of 4 s instead of 100 s


def bc_config(root: Path, hidden_sizes=(128, 64)) -> Path:
    """The shipped BC config, shortened: 2,400 pairs, one epoch, closed-loop evaluation of 4 short episodes."""
    config = yaml.safe_load((ROOT / "configs" / "racing_bc.yaml").read_text())
    config["trainer"]["max_epochs"] = 1
    config["data"]["init_args"].update(episodes=8, steps=300, batch_size=64)
    config["data"]["init_args"]["env"]["init_args"].update(SHORT_EPISODES)
    config["model"]["init_args"]["hidden_sizes"] = list(hidden_sizes)
    evaluation = next(c for c in config["trainer"]["callbacks"] if c["class_path"].endswith("ClosedLoopEvaluation"))
    evaluation["init_args"]["cars"] = 4
    name = "racing_bc" if tuple(hidden_sizes) == (128, 64) else "racing_bc_small"
    config["trainer"]["logger"]["init_args"]["name"] = name
    return write_config(config, root / f"{name}.yaml")


def sac_config(root: Path, actor_init: str | None, shipped: str = "racing_sac.yaml", **model) -> Path:
    """The shipped SAC config (``configs/<shipped>``), shortened: few cars, small buffer and batches, short
    evaluation episodes; ``model`` overrides its init_args (an option group's fields, a mapping, join the config's)."""
    config = yaml.safe_load((ROOT / "configs" / shipped).read_text())
    config["trainer"].update(max_steps=40, max_time=None, enable_progress_bar=False, log_every_n_steps=10)
    for callback in config["trainer"]["callbacks"]:
        if callback["class_path"].endswith("PeriodicEvaluation"):
            callback["init_args"].update(every_n_frames=200, episodes=2)
        if callback["class_path"].endswith("FrameCheckpoint"):
            callback["init_args"]["every_n_frames"] = 10**9
        if callback["class_path"].endswith(".ModelCheckpoint"):  # best.ckpt, checked every 10 updates here
            callback["init_args"]["every_n_train_steps"] = 10
    init_args = config["model"]["init_args"]
    init_args.update(actor_init=actor_init, compile=False)
    init_args.setdefault("actor", {})["warmup_updates"] = 20
    for key, value in model.items():
        if isinstance(value, dict):
            init_args.setdefault(key, {}).update(value)
        else:
            init_args[key] = value
    if actor_init is None:  # from scratch: no clone to stay near
        init_args.setdefault("bc_term", {})["weight"] = 0.0
    data = config["data"]["init_args"]
    data.update(
        num_envs=4, buffer_size=2000, batch_size=32, warmup_frames=64, frames_per_update=2, evaluation={"episodes": 2}
    )
    data["env"]["init_args"].update(SHORT_EPISODES)
    return write_config(config, root / "racing_sac.yaml")


@pytest.fixture(scope="module")
def bc_checkpoint(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("bc")
    fit(
        bc_config(root),
        "--trainer.logger.init_args.save_dir",
        str(root / "runs"),
        "--data.init_args.root",  # its demonstrations under this test's folder, not the current folder's runs/
        str(root / "runs" / "demonstrations"),
        "--trainer.enable_progress_bar",
        "false",
    )
    return root / "runs" / "racing_bc" / "version_0" / "checkpoints" / "last.ckpt"


def deterministic_action(policy, observation: torch.Tensor) -> torch.Tensor:
    with set_exploration_type(ExplorationType.DETERMINISTIC), torch.no_grad():
        return policy(TensorDict({"observation": observation}, batch_size=observation.shape[:1]))["action"]


def test_actor_init_gives_the_clones_actions_and_the_initial_scale(bc_checkpoint):
    from modules.bc import BehaviourCloning

    clone = BehaviourCloning(**SPECS)
    clone.load_state_dict(torch.load(bc_checkpoint, weights_only=True)["state_dict"])
    model = SAC(**SPECS, actor=ActorOptions(init_scale=0.3))
    model.load_behaviour_cloning(bc_checkpoint)
    observation = ENV.reset()["observation"].expand(64, -1) + torch.randn(64, 11)
    torch.testing.assert_close(deterministic_action(model.actor, observation), clone.actor(observation))
    torch.testing.assert_close(model.export_network()(observation), clone.actor(observation))
    with torch.no_grad():
        _, scale = model.actor.module[0].module(observation)
    torch.testing.assert_close(scale, torch.full_like(scale, 0.3))
    # Acting samples around the clone's action, inside the box.
    sampled = model.actor(TensorDict({"observation": observation}, batch_size=[64]))["action"]
    assert not torch.equal(sampled, clone.actor(observation))
    low, high = ENV.action_spec[0].space.low, ENV.action_spec[0].space.high
    assert (sampled >= low).all() and (sampled <= high).all()


def test_an_actor_that_corrects_the_clone_starts_as_the_clone_and_stays_within_its_bound_wherever_it_goes(
    bc_checkpoint,
):
    from modules.bc import BehaviourCloning

    with pytest.raises(ValueError, match="model.actor.correction_bound needs model.actor_init"):
        SAC(**SPECS, actor=ActorOptions(correction_bound=0.5))
    with pytest.raises(ValueError, match="model.actor.correction_bound must be > 0"):
        ActorOptions(correction_bound=0.0)
    clone = BehaviourCloning(**SPECS)
    clone.load_state_dict(torch.load(bc_checkpoint, weights_only=True)["state_dict"])
    model = SAC(**SPECS, actor_init=str(bc_checkpoint), actor=ActorOptions(init_scale=0.3, correction_bound=0.5))
    model.load_behaviour_cloning(bc_checkpoint)
    observation = ENV.reset()["observation"].expand(256, -1) + 3 * torch.randn(256, 11)
    torch.testing.assert_close(deterministic_action(model.actor, observation), clone.actor(observation))
    with torch.no_grad():
        _, scale = model.actor.module[0].module(observation)
    torch.testing.assert_close(scale, torch.full_like(scale, 0.3))

    # The update trains the correction, never the clone, and however far the correction's weights go, the location
    # before tanh stays within the bound of the clone's, on states far outside any it saw (observations of scale 30).
    batch = ENV.step(ENV.reset().update({"action": ENV.action_spec.rand()}))
    model.loss(batch)["loss_actor"].backward()
    correcting = model.actor_network
    assert all(parameter.grad is None for parameter in correcting.clone.parameters())
    assert correcting.correction[-1].weight.grad.abs().sum() > 0
    with torch.no_grad():
        for parameter in correcting.correction.parameters():
            parameter.normal_(0, 10)
    far = 30 * torch.randn(256, 11)
    location = correcting(far).chunk(2, -1)[0]
    clone_location = model.clone_network(far).chunk(2, -1)[0]
    assert (location - clone_location).abs().max() <= 0.5 + 1e-5
    assert (location - clone_location).abs().max() > 0.4  # the correction does move it, up to the bound
    # Export and acting compute the same corrected action.
    torch.testing.assert_close(model.export_network()(far), deterministic_action(model.actor, far))


@pytest.mark.slow
def test_actor_init_of_another_shape_or_a_bad_file_is_an_error_naming_the_flag(tmp_path, bc_checkpoint, capsys):
    with pytest.raises(ValueError, match=r"model.actor_init .*do not fit this actor's"):
        SAC(**SPECS, actor=ActorOptions(hidden_sizes=(64, 64)), actor_init=str(bc_checkpoint))
    corrupt = tmp_path / "corrupt.ckpt"
    corrupt.write_bytes(bc_checkpoint.read_bytes()[:1000])
    with pytest.raises(ValueError, match=r"model.actor_init .*corrupt.ckpt: not a readable"):
        SAC(**SPECS, actor_init=str(corrupt))
    with pytest.raises(ValueError, match=r"model.actor_init .*missing.ckpt: no such checkpoint"):
        SAC(**SPECS, actor_init=str(tmp_path / "missing.ckpt"))
    # Through the command line: one line naming the flag, exit code 2, before anything runs.
    config = sac_config(tmp_path, str(bc_checkpoint), actor={"hidden_sizes": [32]})
    with pytest.raises(SystemExit) as exit_info:
        fit(config)
    assert exit_info.value.code == 2
    error = capsys.readouterr().err.strip().splitlines()
    assert len(error) == 1 and "--model.init_args.actor_init" in error[0] and "do not fit" in error[0]


def pipeline_configs(tmp_path: Path, monkeypatch) -> tuple[Path, Path]:
    """The shortened BC and SAC configs in ``tmp_path/configs``, the current folder ``tmp_path/work``. As the docs run
    the pipeline, from a folder that is not the configs': the SAC config names its BC stage by a path relative to
    itself (as the shipped one does), and the runs are written under the current folder."""
    configs, work = tmp_path / "configs", tmp_path / "work"
    configs.mkdir(), work.mkdir()
    monkeypatch.chdir(work)
    bc = bc_config(configs).resolve()
    return bc, sac_config(configs, bc.name)


@pytest.mark.slow
def test_the_pipeline_runs_each_seeds_bc_stage_once_pairs_sac_against_it_and_reuses_it(tmp_path, monkeypatch, capfd):
    # One command over two seeds: seed k's SAC starts from seed k's clone (its own stage run, at seed k), and the
    # report pairs each seed's final evaluation with its frame-0 one: that clone, on SAC's own evaluation episodes.
    bc, config = pipeline_configs(tmp_path, monkeypatch)
    result = run_app("seeds", "--config", str(config), "--seeds", "2", "--parallel", "2", cwd=Path.cwd())
    assert result.returncode == 0, result.stderr
    stages = {seed: stage_folder(bc, "flag", seed) for seed in (0, 1)}
    assert stages[0] != stages[1] and sorted(Path("runs/racing_bc").iterdir()) == sorted(stages.values())
    for seed, stage in stages.items():
        assert stage.name.startswith("stage-") and stage.name.endswith(f"-seed_{seed}")
        assert (stage / MARKER).is_file() and (stage / "checkpoints" / "last.ckpt").is_file()
        stage_config = yaml.safe_load((stage / "config.yaml").read_text())
        assert stage_config["seed_everything"] == seed and json.loads((stage / MARKER).read_text())["seed"] == seed
        assert stage_config["data"]["init_args"]["seed"] == seed  # its demonstrations too: one set per seed
    assert len(list(Path("runs/demonstrations").glob("demonstrations-*/complete.json"))) == 2
    # The runs' config and hyperparameters keep the stage config as given, so that the saved config.yaml runs (or
    # reuses) the same stage again.
    out = Path("runs/racing_sac_seeds")
    run = out / "seed_0" / "version_0"
    assert yaml.safe_load((run / "config.yaml").read_text())["model"]["init_args"]["actor_init"] == str(bc)
    assert yaml.safe_load((run / "hparams.yaml").read_text())["actor_init"] == str(bc)
    assert (run / "checkpoints" / "best.ckpt").is_file()  # the best evaluation's actor
    # The paired report holds the runs' first and last evaluations and the statistics of their differences.
    pair = json.loads((out / "seeds.json").read_text())["paired"]
    assert pair["start"] == "start (racing_bc stage)"
    differences = []
    for seed in (0, 1):
        returns = [row["eval/return_mean"] for row in read_curve(out / f"seed_{seed}" / "version_0")]
        row = pair["seeds"][str(seed)]
        assert (row["start_return"], row["final_return"]) == (returns[0], returns[-1])
        assert row["difference"] == returns[-1] - returns[0]
        differences.append(row["difference"])
    assert pair["difference"] == episode_statistics(torch.tensor(differences), prefix="difference")
    report = (out / "seeds.md").read_text()
    assert "| seed | start (racing_bc stage) | final | final − start |" in report and pair["verdict"] in report
    within = pair["difference"]["difference_ci_low"] <= 0 <= pair["difference"]["difference_ci_high"]
    assert pair["excludes_zero"] is not within
    assert pair["verdict"].startswith("The difference is within" if within else "The final policy")
    # A plain fit at the config's seed (0) reuses seed 0's finished stage, not run again, and hands the model its
    # checkpoint. The first 20 updates train only the critics: after 10, the actor acts as the clone does.
    capfd.readouterr()
    marker_time = (stages[0] / MARKER).stat().st_mtime_ns
    cli = fit(config, "--trainer.max_steps", "10")
    assert f"reusing its finished run {stages[0]}" in capfd.readouterr().out
    assert cli.model.actor_init == str(stages[0] / "checkpoints" / "last.ckpt")
    assert (stages[0] / MARKER).stat().st_mtime_ns == marker_time and len(list(Path("runs/racing_bc").iterdir())) == 2
    clone = torch.load(stages[0] / "checkpoints" / "last.ckpt", weights_only=True)["state_dict"]
    observation = torch.randn(16, 11)
    expected = torch.tanh(torch.func.functional_call(_bc_network(), _prefixed(clone), (observation,)))
    centre_free = cli.model.export_network()(observation)
    space = cli.model.action_spec.space
    torch.testing.assert_close(centre_free, (space.high + space.low) / 2 + (space.high - space.low) / 2 * expected)
    # `--ckpt_path last` continues the SAC run in its folder, from its own actor: no stage, no clone copied.
    cli = fit(config, "--trainer.max_steps", "20", "--ckpt_path", "last")
    out = capfd.readouterr().out
    assert cli.trainer.global_step == 20 and "Stage" not in out and "actor initialised" not in out
    assert sorted(path.name for path in Path("runs/racing_sac").iterdir()) == ["version_0"]
    # An edited BC config is another stage: a new folder, never the stale run.
    edited = bc.with_name("edited.yaml")
    edited.write_text(bc.read_text() + "\n# edited\n")
    assert stage_folder(edited, "flag", seed=0) != stages[0]


def _bc_network() -> torch.nn.Module:
    from modules.networks import mlp

    return mlp(11, [128, 64], 2)


def _prefixed(state: dict) -> dict:
    return {key[len("actor.network.") :]: value for key, value in state.items() if key.startswith("actor.network.")}


def resume_config(root: Path, bc_checkpoint: Path | None, shipped: str = "racing_sac.yaml") -> Path:
    root.mkdir(parents=True, exist_ok=True)
    actor_init = None if bc_checkpoint is None else str(bc_checkpoint)
    config = yaml.safe_load(sac_config(root, actor_init, shipped).read_text())
    config["trainer"].update(logger=False, default_root_dir=str(root))
    config["trainer"]["callbacks"] = [
        {"class_path": "callbacks.schedule.FrameCheckpoint", "init_args": {"every_n_frames": 10**9}}
    ]
    return write_config(config, root / "resume.yaml")


@pytest.mark.slow
def test_resumed_sac_run_ends_with_identical_weights(tmp_path, bc_checkpoint):
    # 8 frames per collect, 2 per update: 4 updates per collect; the actor's warm-up (20 updates) ends after the
    # stop at 30, so the resumed process must also restore the update counter that ends it. The checkpoint carries
    # the replay buffer, the critics' targets, log α, Adam's state of both groups and every RNG.
    half = 30
    fit(resume_config(tmp_path / "full", bc_checkpoint), "--trainer.max_steps", str(2 * half))
    interrupted = resume_config(tmp_path / "half", bc_checkpoint)
    fit(interrupted, "--trainer.max_steps", str(half))
    first_half = weights(tmp_path / "half/checkpoints/last.ckpt")
    cli = fit(
        interrupted,
        "--trainer.max_steps",
        str(2 * half),
        "--ckpt_path",
        "last",
        *RESEEDED,
    )
    assert cli.trainer.global_step == 2 * half
    full, resumed = weights(tmp_path / "full/checkpoints/last.ckpt"), weights(tmp_path / "half/checkpoints/last.ckpt")
    assert full.keys() == resumed.keys()
    assert any("target_qvalue" in key for key in full) and "loss_module.log_alpha" in full
    for key in full:
        assert torch.equal(full[key], resumed[key]), key
    moved = [
        key for key in resumed if resumed[key].is_floating_point() and not torch.equal(first_half[key], resumed[key])
    ]
    assert "loss_module.log_alpha" in moved and any("target_qvalue" in key for key in moved)
    assert any(key.startswith("actor.") for key in moved)  # the actor trained after its warm-up


@pytest.mark.slow
def test_the_same_seed_beside_a_busy_process_gives_the_same_policy_and_curve(tmp_path):
    # What "the same command gives the same policy on any day" needs: nothing in the run depends on how fast it goes.
    # The second run shares the CPU with a process that keeps a core busy. (From scratch: the clone of another
    # observation than this config's is the module's fixture, and the start does not bear on the question.)
    runs = {}
    for name in ("alone", "busy"):
        (tmp_path / name).mkdir()
        config = sac_config(tmp_path / name, None, "racing_sac_circuits.yaml")
        busy = subprocess.Popen([sys.executable, "-c", "while True: pass"]) if name == "busy" else None
        try:
            fit(
                config,
                "--trainer.logger.init_args.save_dir",
                str(tmp_path / name / "runs"),
                "--trainer.max_steps",
                "100",
            )
        finally:
            if busy is not None:
                busy.kill()
                busy.wait()
        runs[name] = tmp_path / name / "runs" / "racing_sac_circuits" / "version_0"
    alone, busy = (weights(runs[name] / "checkpoints" / "last.ckpt") for name in ("alone", "busy"))
    assert alone.keys() == busy.keys() and all(torch.equal(alone[key], busy[key]) for key in alone)
    curves = {
        name: [(row["frames"], row["eval/progress_mean"]) for row in read_curve(run)] for name, run in runs.items()
    }
    assert len(curves["alone"]) > 2 and curves["alone"] == curves["busy"]


@pytest.mark.slow
def test_resume_on_a_circuit_distribution_draws_the_same_circuits(tmp_path):
    # configs/racing_sac_circuits.yaml from scratch, episodes of 10 steps: every car draws a new circuit of the pool
    # every 10 steps, so a resume that lost the cars' circuits or their draw counters would train on other data.
    half = 30
    circuits = ("--data.init_args.env.init_args.max_steps", "10", "--data.init_args.env.init_args.tracks.pool", "8")
    fit(
        resume_config(tmp_path / "full", None, "racing_sac_circuits.yaml"),
        "--trainer.max_steps",
        str(2 * half),
        *circuits,
    )
    interrupted = resume_config(tmp_path / "half", None, "racing_sac_circuits.yaml")
    fit(interrupted, "--trainer.max_steps", str(half), *circuits)
    state = torch.load(tmp_path / "half/checkpoints/last.ckpt", weights_only=True)["ReplayDataModule"]["env"]
    assert len(state["circuit"].unique()) > 1 and state["draws"].min() > 2  # several episodes, several circuits
    fit(interrupted, "--trainer.max_steps", str(2 * half), "--ckpt_path", "last", *RESEEDED, *circuits)
    full, resumed = weights(tmp_path / "full/checkpoints/last.ckpt"), weights(tmp_path / "half/checkpoints/last.ckpt")
    for key in full:
        assert torch.equal(full[key], resumed[key]), key


@pytest.mark.slow
@pytest.mark.parametrize("option", [("--trainer.precision", "bf16-mixed"), ("--model.init_args.compile", "true")])
def test_bf16_mixed_and_compiled_updates_train_with_finite_losses(tmp_path, option):
    cli = fit(resume_config(tmp_path, None), *option, "--model.init_args.actor.warmup_updates", "0")
    assert cli.trainer.global_step == 40
    for key in ("train/loss", "train/loss_actor", "train/loss_qvalue", "train/loss_alpha"):
        assert math.isfinite(float(cli.trainer.logged_metrics[key])), key
    assert float(cli.trainer.logged_metrics["train/alpha"]) != pytest.approx(0.01)  # α is tuned


def test_compiled_and_eager_losses_agree_on_the_same_batch():
    torch.manual_seed(0)
    eager = SAC(**SPECS, actor=ActorOptions(hidden_sizes=(16,)), critics=CriticOptions(hidden_sizes=(16,)))
    compiled = copy.deepcopy(eager)
    compiled.compile_mode = True
    loss = compiled.compiled(compiled.loss)
    env = RacingEnv(num_envs=32, curvature_ahead=[5, 15, 30])
    td = env.reset()
    td["action"] = env.action_spec.rand()
    batch = env.step(td)
    for _ in range(3):
        with torch.random.fork_rng():
            torch.manual_seed(1)
            expected = eager.loss(batch.clone())
        with torch.random.fork_rng():
            torch.manual_seed(1)
            actual = loss(batch.clone())
        for key in ("loss_actor", "loss_qvalue", "loss_alpha"):
            torch.testing.assert_close(actual[key], expected[key], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(("critics", "learn_alpha"), [(1, True), (2, True), (3, True), (2, False)])
def test_the_update_loss_is_torchrls_sac_loss_in_values_and_gradients(critics, learn_alpha):
    # The update computes SACLoss's losses from its parameters (batched critics, the density written out): the same
    # terms, and the same gradient for every parameter, as SACLoss.forward from the same random draws. The racing
    # car's box is asymmetric per dimension; α is off its start, and a third of the transitions end their episode.
    # A fixed α (the Zoo's numeric ent_coef) is no parameter: nothing trains it, its loss is logged as SACLoss's.
    torch.manual_seed(0)
    actor, critic_options = ActorOptions(hidden_sizes=(16, 8)), CriticOptions(hidden_sizes=(16, 8), count=critics)
    model = SAC(**SPECS, actor=actor, critics=critic_options, gamma=0.9, learn_alpha=learn_alpha)
    log_alpha = model.loss_module.log_alpha
    assert any(p is log_alpha for p in model.trainable_parameters()) == learn_alpha
    with torch.no_grad():
        model.loss_module.log_alpha.fill_(-0.7)
        for target in model.loss_module.target_qvalue_network_params.values(True, True):
            target.add_(0.1 * torch.randn_like(target))  # targets that differ from the critics
    env = RacingEnv(num_envs=64, curvature_ahead=[5, 15, 30])
    td = env.reset()
    td["action"] = env.action_spec.rand()
    batch = env.step(td)
    batch["next", "terminated"][::3] = True
    keys = {"loss_actor", "loss_qvalue", "loss_alpha", "alpha", "entropy"}
    assert_same_losses_and_gradients(model, model.loss_module, model.loss, batch, keys)


def test_soft_update_is_torchrl_soft_update():
    model = SAC(**SPECS, actor=ActorOptions(hidden_sizes=(8,)), critics=CriticOptions(hidden_sizes=(8,), tau=0.1))
    with torch.no_grad():
        for parameter in model.loss_module.qvalue_network_params.values(True, True):
            if isinstance(parameter, torch.nn.Parameter):  # not the critics' constant action scaling
                parameter.add_(torch.randn_like(parameter))
    ours = copy.deepcopy(model)
    model.target_updater.step()
    ours.soft_update()
    expected = model.loss_module.target_qvalue_network_params.flatten_keys()
    actual = ours.loss_module.target_qvalue_network_params.flatten_keys()
    for key in expected.keys():  # noqa: SIM118 (iterating a TensorDict walks its batch)
        torch.testing.assert_close(actual[key], expected[key], rtol=0, atol=1e-6)


def test_bare_tanh_gaussian_log_density_is_torchrls():
    location, scale = torch.randn(256, 2), torch.rand(256, 2) + 0.1
    space = ENV.action_spec[0].space
    centre, half_range = (space.high + space.low) / 2, (space.high - space.low) / 2
    noise = torch.randn(256, 2)
    action, log_prob = tanh_gaussian_sample(location, scale, noise, centre, half_range)
    distribution = TanhNormal(location, scale, low=space.low, high=space.high, safe_tanh=False)
    expected_action = centre + half_range * torch.tanh(location + scale * noise)
    torch.testing.assert_close(action, expected_action)
    inside = (location + scale * noise).abs() < 3  # tanh's inverse is accurate away from saturation
    torch.testing.assert_close(
        log_prob[inside.all(-1)], distribution.log_prob(action)[inside.all(-1)], rtol=1e-4, atol=1e-4
    )


@pytest.mark.slow
def test_validate_and_export_work_for_the_bc_and_sac_policies(tmp_path, bc_checkpoint):
    from callbacks.export import PolicyExport
    from export.loader import TracedPolicy
    from modules.bc import BehaviourCloning

    # BC: `validate` runs the held-out loss from the checkpoint; the export traces the clone.
    bc_yaml = bc_checkpoint.parents[1] / "config.yaml"
    results = _main(["validate", "--config", str(bc_yaml), "--ckpt_path", str(bc_checkpoint)])
    assert math.isfinite(results.trainer.callback_metrics["val/loss"])
    # SAC: `validate` plays deterministic episodes; then a fit with the export callback traces the mean action.
    config = resume_config(tmp_path, bc_checkpoint)
    export = {
        "class_path": "callbacks.export.PolicyExport",
        "init_args": {"batch_sizes": [4], "backend": "torchscript", "benchmark": False},
    }
    data = yaml.safe_load(config.read_text())
    data["trainer"]["callbacks"].append(export)
    config = write_config(data, tmp_path / "export.yaml")
    cli = fit(config)
    exporter = next(c for c in cli.trainer.callbacks if isinstance(c, PolicyExport))
    traced = TracedPolicy.load(tmp_path / "export")
    assert traced.backend_in_use == "torchscript" and exporter.metadata["output"]["kind"] == "actions"
    observation = ENV.reset()["observation"].expand(4, -1).contiguous()
    torch.testing.assert_close(traced(observation), deterministic_action(cli.model.actor, observation))
    torch.testing.assert_close(traced.act(observation), traced(observation))  # the action itself, not an argmax
    results = _main(["validate", "--config", str(config), "--ckpt_path", str(tmp_path / "checkpoints/last.ckpt")])
    assert "eval/return_mean" in results.trainer.callback_metrics
    assert isinstance(BehaviourCloning(**SPECS).export_network(), torch.nn.Module)


def _main(args: list[str]):
    from app.cli import main

    return main(args)


def test_bc_term_is_zero_at_the_clone_and_pulls_a_moved_actor_back(bc_checkpoint):
    with pytest.raises(ValueError, match="model.bc_term.weight > 0 needs model.actor_init"):
        SAC(**SPECS, bc_term=BCTermOptions(weight=1.0))
    model = SAC(**SPECS, actor_init=str(bc_checkpoint), bc_term=BCTermOptions(weight=5.0))
    model.load_behaviour_cloning(bc_checkpoint)
    assert model.training_loss() == model.loss_near_clone  # its own function: its own compiled graphs
    env = RacingEnv(num_envs=64, curvature_ahead=[5, 15, 30])
    td = env.reset()
    td["action"] = env.action_spec.rand()
    batch = env.step(td)
    assert float(model.loss_near_clone(batch.clone())["loss_bc"]) == 0.0
    with torch.no_grad():
        model.actor_network[-1].bias[:2] += 0.5  # the actor's mean moves away from the clone's
    loss = model.loss_near_clone(batch.clone())["loss_bc"]
    assert float(loss) > 0
    loss.backward()
    assert (model.actor_network[-1].bias.grad[:2] > 0).any()  # gradient descent moves it back
    assert model.clone_network[-1].bias.grad is None  # the clone itself stays as it was


def test_the_tether_falls_linearly_to_its_floor_and_a_floor_above_it_is_one_error(bc_checkpoint):
    tether = BCTermOptions(weight=50.0, frames=1000, weight_end=10.0)
    model = SAC(**SPECS, actor_init=str(bc_checkpoint), bc_term=tether)
    data = SimpleNamespace(frames=0)  # the frame counter the schedule reads
    model.trainer = SimpleNamespace(datamodule=data)
    weights = []
    for frames in (0, 250, 500, 1000, 5000):
        data.frames = frames
        model.follow_frames()
        weights.append(float(model.bc_weight))
    assert weights == [50.0, 40.0, 30.0, 10.0, 10.0]
    with pytest.raises(ValueError, match=r"model.bc_term.weight_end must be in \[0, weight = 5.0\], got 6.0"):
        SAC(**SPECS, actor_init=str(bc_checkpoint), bc_term=BCTermOptions(weight=5.0, weight_end=6.0))


def test_a_critic_count_below_one_is_one_error_naming_the_flag():
    with pytest.raises(ValueError, match=r"^model.critics.count must be >= 1, got 0$"):
        SAC(**SPECS, critics=CriticOptions(count=0))


@pytest.mark.slow
def test_a_stage_that_fails_or_cannot_be_found_again_is_an_error_naming_the_flag(tmp_path, monkeypatch, capsys):
    from app.stages import run_stage

    monkeypatch.chdir(tmp_path)
    no_logger = write_config({"trainer": {"logger": False}}, tmp_path / "no_logger.yaml")
    with pytest.raises(ValueError, match="--flag .*no_logger.yaml: a stage config needs a trainer logger"):
        run_stage(no_logger, "--flag")
    # Through the command line: one line naming the flag, exit code 2, before anything is built or written.
    with pytest.raises(SystemExit) as exit_info:
        fit(sac_config(tmp_path, str(no_logger)))
    assert exit_info.value.code == 2
    error = capsys.readouterr().err.strip().splitlines()
    assert error == [
        f"error: --model.init_args.actor_init {no_logger}: a stage config needs a trainer logger "
        "with init_args.save_dir (and name), where its run is kept and found again"
    ]
    assert not Path("runs").exists()
    # A model built in code cannot run a stage: it needs the checkpoint, and says so naming the flag.
    with pytest.raises(ValueError, match=r"model.actor_init .*no_logger.yaml: .*needs the \.ckpt"):
        SAC(**SPECS, actor_init=str(no_logger)).load_behaviour_cloning(no_logger)
    failing = yaml.safe_load(bc_config(tmp_path).read_text())
    failing["model"]["init_args"]["lr"] = -1.0  # the stage's own CLI refuses it: exit code 2
    failing = write_config(failing, tmp_path / "failing.yaml")
    with pytest.raises(RuntimeError, match="--flag .*failing.yaml: the stage exited with code 2"):
        run_stage(failing, "--flag")
    assert not (stage_folder(failing, "--flag") / MARKER).exists()  # never taken for a finished stage


def test_other_ranks_wait_for_the_stage_rank_zero_runs_then_reuse_it(tmp_path, monkeypatch, capsys):
    import threading

    from app.stages import run_stage

    monkeypatch.chdir(tmp_path)
    bc = bc_config(tmp_path)
    stage = stage_folder(bc, "--flag")

    def rank_zero_finishes() -> None:  # what run_stage leaves behind on rank 0
        (stage / "checkpoints").mkdir(parents=True)
        (stage / "checkpoints" / "last.ckpt").write_bytes(b"")
        (stage / MARKER).write_text("{}")

    timer = threading.Timer(0.3, rank_zero_finishes)
    timer.start()
    assert run_stage(bc, "--flag", wait=True, poll_seconds=0.05) == stage / "checkpoints" / "last.ckpt"
    timer.join()
    assert capsys.readouterr().out.splitlines() == [
        f"Stage {bc}: waiting for rank 0 to finish it in {stage}",
        f"Stage {bc}: reusing its finished run {stage}",
    ]
