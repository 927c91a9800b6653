"""The PIRL physics: vehicle dynamics on hand-checked cases, the PDE residual against closed forms, collocation."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from envs.safety.physics import (
    DEG,
    TAU,
    ToyPhysics,
    VehicleParameters,
    VehiclePhysics,
    vehicle_controls,
    vehicle_dynamics,
    waypoint_curvature,
)
from modules.pde import pde_residual


def test_action_index_maps_to_throttle_and_steer():
    throttle, steer = vehicle_controls(torch.arange(25))
    assert torch.allclose(throttle[::5], torch.tensor([0.6, 0.7, 0.8, 0.9, 1.0]))
    assert torch.allclose(steer[:5], torch.tensor([-0.8, -0.4, 0.0, 0.4, 0.8]))
    assert torch.allclose(throttle[7], torch.tensor(0.7)) and torch.allclose(steer[7], torch.tensor(0.0))


def test_straight_driving_matches_the_drivetrain_by_hand():
    p = VehicleParameters()
    vx, psi = torch.tensor([12.0]), torch.tensor([10.0])  # heading error 10°
    zero = torch.zeros(1)
    dvx, dbeta, domega, de, dpsi, ds = vehicle_dynamics(vx, zero, zero, zero, psi, torch.tensor([0.8]), zero)
    drive = p.cm1 * 0.8 - p.cr0 - p.cr2 * 12.0**2  # no slip, no steer: no tyre forces
    assert dvx.item() == pytest.approx(drive / p.mass, rel=1e-5)
    assert dbeta.item() == pytest.approx(0.0, abs=1e-5) and domega.item() == pytest.approx(0.0, abs=1e-5)
    assert de.item() == pytest.approx(12.0 * math.sin(math.radians(10.0)), rel=1e-5)
    assert ds.item() == pytest.approx(12.0 * math.cos(math.radians(10.0)), rel=1e-5)
    assert dpsi.item() == pytest.approx(0.0, abs=1e-5)  # a straight road: heading error changes with yaw only


def test_front_tyre_force_by_hand_and_mirror_symmetry():
    p = VehicleParameters()
    vx, zero = torch.tensor([10.0, 10.0]), torch.zeros(2)
    steer = torch.tensor([0.4, -0.4])
    dvx, dbeta, domega, *_ = vehicle_dynamics(vx, zero, zero, zero, zero, torch.full((2,), 0.6), steer)
    delta = 0.4 * math.radians(p.max_steer_deg)  # β = ω = 0: the front slip angle is the steering angle
    force = p.df * math.sin(p.cf * math.atan(p.bf * delta))
    assert domega[0].item() == pytest.approx(force * p.lf * math.cos(delta) / p.yaw_inertia * DEG, rel=1e-4)
    assert domega[0] > 0 and domega[1] == pytest.approx(-domega[0].item(), rel=1e-6)  # steering left turns left
    assert dvx[0] == pytest.approx(dvx[1].item(), rel=1e-6)  # the front force brakes both ways alike
    assert dbeta[1] == pytest.approx(-dbeta[0].item(), rel=1e-6)


def test_road_curvature_turns_the_heading_error():
    one, zero = torch.ones(1) * 10.0, torch.zeros(1)
    *_, dpsi, ds = vehicle_dynamics(one, zero, zero, zero, zero, torch.tensor([0.6]), zero, curvature=0.04)
    assert dpsi.item() == pytest.approx(-0.04 * ds.item() * DEG, rel=1e-5)  # the road turns away under the car


def test_waypoint_curvature_of_a_straight_and_of_a_circle():
    straight = torch.zeros(16)
    straight[5:10] = torch.tensor([2.0, 4.0, 6.0, 8.0, 10.0])
    assert waypoint_curvature(straight).item() == pytest.approx(0.0, abs=1e-6)
    radius, arcs = 25.0, torch.tensor([2.0, 4.0, 6.0, 8.0, 10.0])
    circle = torch.zeros(16)
    circle[5:10] = radius * torch.sin(arcs / radius)
    circle[10:15] = radius * (1 - torch.cos(arcs / radius))
    assert waypoint_curvature(circle).item() == pytest.approx(1 / radius, rel=1e-3)


def test_vehicle_drift_has_zero_waypoint_drift_and_unit_time_decay():
    state = torch.zeros(4, 16)
    state[:, 0], state[:, 5:10], state[:, TAU] = 10.0, torch.tensor([2.0, 4, 6, 8, 10]), 3.0
    drift = VehiclePhysics().drift(state, torch.tensor([0, 7, 12, 24]))
    assert torch.all(drift[:, 5:15] == 0) and torch.all(drift[:, TAU] == -1)
    assert torch.isfinite(drift).all()


class _Quadratic(nn.Module):
    """Q(x) = [Σx², Σx²/2]: a* = 0 and ∇V = 2x, in closed form."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        square = x.pow(2).sum(-1, keepdim=True)
        return torch.cat((square, square / 2), -1)


@pytest.mark.parametrize("method", ["autograd", "func"])
def test_pde_residual_matches_the_closed_form(method):
    physics = ToyPhysics(controls=(1.0, -1.0))
    x = torch.tensor([[0.5, -0.3, 0.8], [-1.2, 0.7, 0.1]])
    residual = pde_residual(_Quadratic(), x, physics.drift, method)
    x1, x2, tau = x.unbind(-1)
    by_hand = 2 * x1 * (-(x1**3) - x2) + 2 * x2 * (x1 + x2 + 1.0) + 2 * tau * (-1.0)  # u of a* = 0 is +1
    torch.testing.assert_close(residual, by_hand)


def test_pde_residual_of_a_linear_q_is_its_weights_dot_the_drift():
    torch.manual_seed(0)
    linear = nn.Linear(16, 25)
    x = torch.randn(8, 16)
    x[:, 0] = 10.0
    physics = VehiclePhysics()
    best = linear(x).argmax(-1)
    expected = (linear.weight[best] * physics.drift(x, best)).sum(-1)
    torch.testing.assert_close(pde_residual(linear, x, physics.drift), expected)


def test_autograd_and_torch_func_agree_on_values_and_parameter_gradients():
    torch.manual_seed(0)
    network = nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 25), nn.Sigmoid())
    physics = VehiclePhysics()
    x = physics.collocation(32, torch.randn(64, 16))["interior"]
    grads, values = [], []
    for method in ("autograd", "func"):
        network.zero_grad()
        residual = pde_residual(network, x, physics.drift, method)
        residual.pow(2).mean().backward()
        grads.append([p.grad.clone() for p in network.parameters()])
        values.append(residual.detach())
    torch.testing.assert_close(values[0], values[1], rtol=1e-4, atol=1e-6)
    for a, b in zip(*grads, strict=True):
        assert a.abs().sum() > 0  # the residual's graph reaches the weights (create_graph)
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-7)


def test_collocation_points_stay_in_the_box_and_on_the_boundaries():
    torch.manual_seed(0)
    physics = VehiclePhysics(lateral_bound=1.0, tau_max=5.0)
    replay = torch.randn(10, 16)
    points = physics.collocation(256, replay)
    interior = points["interior"]
    assert interior[:, 0].min() >= 5 and interior[:, 0].max() <= 20
    assert interior[:, 1].abs().max() <= 10 and interior[:, 2].abs().max() <= 30
    assert interior[:, 3].abs().max() <= 0.95 and interior[:, 4].abs().max() <= 30
    assert interior[:, TAU].min() >= 0 and interior[:, TAU].max() <= 5
    # Waypoint dimensions come from replay rows.
    assert all(any(torch.equal(row[5:15], r[5:15]) for r in replay) for row in interior)
    assert torch.all(points["terminal"][:, TAU] == 0)
    assert torch.all(points["unsafe"][:, 3].abs() == 1.0)
    assert (points["unsafe"][:, 3] > 0).any() and (points["unsafe"][:, 3] < 0).any()
