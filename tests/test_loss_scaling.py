"""Loss scaling by hand against torch.amp.GradScaler (course_lib.loss_scaling)."""

import numpy as np
import pytest
import torch

from course_lib.loss_scaling import LossScaler, update_scale


def test_update_scale_backs_off_on_inf_and_grows_after_the_interval():
    assert update_scale(1024.0, 5, True) == pytest.approx((512.0, 0))
    assert update_scale(1024.0, 0, False, growth_interval=3) == pytest.approx((1024.0, 1))
    assert update_scale(1024.0, 2, False, growth_interval=3) == pytest.approx((2048.0, 0))
    assert update_scale(8.0, 0, True, backoff_factor=0.25) == pytest.approx((2.0, 0))
    for tracker in (5, 3, -1):  # past the interval, the scale would never grow
        with pytest.raises(ValueError, match="growth_tracker counts clean steps"):
            update_scale(1.0, tracker, False, growth_interval=3)
    for interval in (0, 2.5):
        with pytest.raises(ValueError, match="as torch.amp.GradScaler asks"):
            update_scale(1.0, 0, False, growth_interval=interval)


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3))


@pytest.mark.parametrize("infs_at", [(), (1, 4, 5, 9)])
def test_hand_written_scaler_matches_grad_scaler_step_for_step(infs_at):
    ours_model, torch_model = _model(), _model()
    ours_opt = torch.optim.SGD(ours_model.parameters(), lr=0.1)
    torch_opt = torch.optim.SGD(torch_model.parameters(), lr=0.1)
    rule = dict(growth_factor=2.0, backoff_factor=0.5, growth_interval=3)
    ours = LossScaler(2.0 ** 10, **rule)
    theirs = torch.amp.GradScaler("cpu", init_scale=2.0 ** 10, **rule)
    g = torch.Generator().manual_seed(1)
    scales = []
    for step in range(12):
        x, y = torch.randn(32, 8, generator=g), torch.randint(3, (32,), generator=g)
        for model, opt, scaler in ((ours_model, ours_opt, ours), (torch_model, torch_opt, theirs)):
            opt.zero_grad()
            scaler.scale(torch.nn.functional.cross_entropy(model(x), y)).backward()
            if step in infs_at:  # an overflow in one gradient, as fp16 would produce
                model[0].weight.grad[0, 0] = float("inf")
            scaler.step(opt)
            scaler.update()
        assert ours.scale_value == pytest.approx(theirs.get_scale()), f"step {step}"
        scales.append(ours.scale_value)
        for a, b in zip(ours_model.parameters(), torch_model.parameters(), strict=True):
            torch.testing.assert_close(a, b, rtol=0, atol=1e-12)
    assert [h["stepped"] for h in ours.history] == [s not in infs_at for s in range(12)]
    if infs_at:  # back-off at every inf, growth after three clean steps
        assert scales[:9] == pytest.approx([1024, 512, 512, 512, 256, 128, 128, 128, 256])


def test_static_scaler_keeps_its_scale_and_still_skips_an_overflowing_step():
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = LossScaler(128.0, dynamic=False)
    before = [p.detach().clone() for p in model.parameters()]
    scaler.scale(model(torch.ones(2, 8)).sum()).backward()
    model[2].bias.grad[0] = float("nan")
    assert scaler.step(opt) is False
    scaler.update()
    assert scaler.scale_value == pytest.approx(128.0)
    for a, b in zip(model.parameters(), before, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-12)  # the step was skipped


def test_unscale_clip_step_matches_gradscaler_and_unscales_once():
    """unscale_ before clipping, then step: the gradients are divided by S once, as torch's."""
    x = torch.randn(4, 8)
    params = []
    for use_torch in (False, True):
        model = _model()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 12) if use_torch else \
            LossScaler(2.0 ** 12)
        scaler.scale(model(x).sum()).backward()
        scaler.unscale_(opt)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
        scaler.step(opt)
        scaler.update()
        params.append(torch.cat([p.detach().flatten() for p in model.parameters()]))
    torch.testing.assert_close(params[0], params[1])
    scaler, opt = LossScaler(4.0), torch.optim.SGD(_model().parameters(), lr=0.1)
    scaler.unscale_(opt)
    with pytest.raises(RuntimeError, match="unscale_.. was already called on this optimizer"):
        scaler.unscale_(opt)
    scaler.step(opt)
    with pytest.raises(RuntimeError, match="step.. was already called on this optimizer"):
        scaler.step(opt)
    scaler.update()
    scaler.unscale_(opt)  # a new iteration


def test_the_dynamic_rule_refuses_a_scale_no_scaler_has_and_takes_numpy_counts():
    for scale in (0.0, -1.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="scale must be positive and finite"):
            update_scale(scale, 0, False)
    assert update_scale(8.0, np.int64(9), False, growth_interval=np.int64(10)) == (16.0, 0)


def test_unscale_divides_the_gradients_by_the_scale():
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(4, 8)
    model(x).sum().backward()
    plain = [p.grad.clone() for p in model.parameters()]
    opt.zero_grad()
    scaler = LossScaler(2.0 ** 12)
    scaler.scale(model(x).sum()).backward()
    assert scaler.unscale_(opt) is False
    for p, g in zip(model.parameters(), plain, strict=True):
        torch.testing.assert_close(p.grad, g)
    with pytest.raises(ValueError, match="positive"):
        LossScaler(0.0)
    with pytest.raises(ValueError, match="positive and finite"):
        LossScaler(float("inf"))  # every step would overflow and be skipped, forever
    for rule in (dict(growth_factor=0.5), dict(growth_factor=1.0), dict(backoff_factor=0.0),
                 dict(backoff_factor=1.5), dict(growth_interval=0)):
        with pytest.raises(ValueError, match="as torch.amp.GradScaler asks: growth_factor > 1"):
            LossScaler(2.0 ** 12, **rule)
