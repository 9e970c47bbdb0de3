"""zt's loss scaler against DeepSpeed's, written out here from DeepSpeed's DynamicLossScaler.update_scale
(deepspeed/runtime/fp16/loss_scaler.py) and its static LossScaler: random step outcomes for many settings of
initial_scale_power, loss_scale_window, hysteresis, min_loss_scale and consecutive_hysteresis (and static
scales, fp16.loss_scale > 0). The scale after every step and whether the step was skipped must be the same
until DeepSpeed stops (an overflow at min_loss_scale with no hysteresis left, raise_error_at_min_scale);
zt stops (COLLAPSED) no earlier than that.

usage: loss_scale_ref.py LOSS_SCALE_DUMP"""
import random
import subprocess
import sys

SKIPPED, HALVED, DOUBLED, COLLAPSED = 1, 2, 4, 8


class DeepSpeedDynamic:
    """DynamicLossScaler.update_scale, scale_factor 2, raise_error_at_min_scale True."""

    def __init__(self, power, window, hysteresis, min_scale, consecutive):
        self.cur_scale = 2.0 ** power
        self.scale_window = window
        self.min_scale = min_scale
        self.delayed_shift = hysteresis
        self.cur_hysteresis = hysteresis
        self.consecutive_hysteresis = consecutive
        self.cur_iter = 0
        self.last_overflow_iter = -1

    def update_scale(self, overflow):
        """Returns False when DeepSpeed raises ("Current loss scale already at minimum")."""
        if overflow:
            if self.delayed_shift == 1 or self.cur_hysteresis == 1:
                if self.cur_scale == self.min_scale:
                    return False
                self.cur_scale = max(self.cur_scale / 2, self.min_scale)
            else:
                self.cur_hysteresis -= 1
            self.last_overflow_iter = self.cur_iter
        else:
            if self.consecutive_hysteresis:
                self.cur_hysteresis = self.delayed_shift
            if (self.cur_iter - self.last_overflow_iter) % self.scale_window == 0:
                if not self.consecutive_hysteresis:
                    self.cur_hysteresis = self.delayed_shift
                self.cur_scale *= 2
        self.cur_iter += 1
        return True


def main():
    dump = sys.argv[1]
    rng = random.Random(20240917)
    cases, lines = [], []
    for _ in range(3000):
        power = rng.randint(0, 8)
        min_scale = rng.choice([1.0, 2.0, 4.0, 0.5, 3.0])
        if 2.0 ** power < min_scale:  # zt refuses it (settings.c); DeepSpeed would start below its minimum
            power = 3
        window, hysteresis = rng.randint(1, 6), rng.randint(1, 4)
        consecutive = rng.random() < 0.5
        p_overflow = rng.choice([0.1, 0.3, 0.6, 0.9])
        outcomes = "".join("1" if rng.random() < p_overflow else "0" for _ in range(rng.randint(1, 60)))
        cases.append(("dynamic", power, window, hysteresis, min_scale, consecutive, outcomes))
        lines.append(f"dynamic {power} {window} {hysteresis} {min_scale!r} {int(consecutive)} {outcomes}")
    for _ in range(200):
        scale, hysteresis = rng.choice([1.0, 128.0, 1024.0, 0.25]), rng.randint(1, 3)
        outcomes = "".join("1" if rng.random() < 0.3 else "0" for _ in range(rng.randint(1, 40)))
        cases.append(("static", scale, hysteresis, outcomes))
        lines.append(f"static {scale!r} {hysteresis} {outcomes}")
    out = subprocess.run([dump], input="\n".join(lines) + "\n", capture_output=True, text=True, check=True).stdout
    results = out.splitlines()
    assert len(results) == len(cases), (len(results), len(cases))
    failures = compared = 0
    for case, result in zip(cases, results):
        steps = [(float(s), int(f)) for s, f in (item.split(":") for item in result.split())]
        if case[0] == "static":
            _, scale, hysteresis, outcomes = case
            run = 0
            for k, (o, (zs, zf)) in enumerate(zip(outcomes, steps)):
                run = run + 1 if o == "1" else 0
                want = (SKIPPED if o == "1" else 0) | (COLLAPSED if run >= 2 * hysteresis else 0)
                if zs != scale or zf != want:
                    failures += 1
                    print(f"FAIL {case} step {k + 1}: zt {zs}:{zf}, expected {scale}:{want}")
                    break
                compared += 1
            continue
        _, power, window, hysteresis, min_scale, consecutive, outcomes = case
        ds = DeepSpeedDynamic(power, window, hysteresis, min_scale, consecutive)
        for k, (o, (zs, zf)) in enumerate(zip(outcomes, steps)):
            if not ds.update_scale(o == "1"):
                break  # DeepSpeed stops here; zt may go on a little (2 x hysteresis at the minimum)
            if zf & COLLAPSED:
                failures += 1
                print(f"FAIL {case} step {k + 1}: zt collapsed while DeepSpeed goes on")
                break
            if zs != ds.cur_scale or bool(zf & SKIPPED) != (o == "1"):
                failures += 1
                print(f"FAIL {case} step {k + 1}: zt scale {zs} flags {zf}, DeepSpeed {ds.cur_scale}")
                break
            compared += 1
    print(f"loss scaler vs DeepSpeed's algorithm: {len(cases)} sequences, {compared} steps compared, "
          f"{failures} failure(s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
