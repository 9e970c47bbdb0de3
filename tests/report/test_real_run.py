#!/usr/bin/env python3
"""zt-report on the metrics of a real run: a tiny LLaMA trained for a few steps on the CPU by zt-run
on the bundled example data (prepared by zt-prep). The page's series are the values of metrics.jsonl
read here with Python's json, its config table shows the keys the run was given, the PNGs decode;
--follow started while zt-run trains ends, with exit 0, when zt-run closes its metrics file.

usage: test_real_run.py ZT_REPORT ZT_RUN ZT_PREP SOURCE_DIR WORK_DIR
"""
import json
import os
import shutil
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import pngread  # noqa: E402
from test_report import check, failures, parse_page, series_of  # noqa: E402


def main():
    zt_report, zt_run, zt_prep, src, work = sys.argv[1:6]
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    data, run = os.path.join(work, 'data'), os.path.join(work, 'run')
    p = subprocess.run([zt_prep, os.path.join(src, 'examples/data/tasks.json'), '-t',
                        os.path.join(src, 'examples/data/tokenizer.model'), '-o', data, '--max-len', '64',
                        '--no-progress'], capture_output=True, text=True)
    if p.returncode != 0:
        print(p.stderr)
        return 1
    steps = 5
    train = subprocess.Popen([zt_run, '--data', data, '--output-dir', run, '--set', 'device=cpu',
                              '--set', 'model.preset=tiny', '--set', f'steps={steps}', '--set', 'data.seq_len=64',
                              '--set', 'train_micro_batch_size_per_gpu=2', '--set', 'eval.every=2',
                              '--set', 'eval.batches=1', '--set', 'checkpoint.every=0'],
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    metrics = os.path.join(run, 'metrics.jsonl')
    deadline = time.time() + 120
    while not os.path.exists(metrics) and train.poll() is None and time.time() < deadline:
        time.sleep(0.05)
    follow = subprocess.run([zt_report, '--follow', run, '--interval', '0.2'], capture_output=True, text=True,
                            timeout=300)
    log, _ = train.communicate(timeout=300)
    if train.returncode != 0:
        print(log)
        check(False, f'zt-run trains (exit {train.returncode})')
        return 1
    print(follow.stdout[-600:], follow.stderr, sep='')
    check(follow.returncode == 0 and f'the run finished: step {steps}/{steps}' in follow.stdout,
          f'--follow of the live zt-run ends with it, exit 0: {follow.returncode}')
    check(follow.stdout.splitlines()[0].startswith('step ') or 'no step recorded yet' in follow.stdout,
          '--follow shows the run\'s steps')

    out = os.path.join(work, 'report.html')
    p = subprocess.run([zt_report, run, '-o', out], capture_output=True, text=True)
    check(p.returncode == 0, f'zt-report exits 0: {p.stderr}')
    records = [json.loads(line) for line in open(metrics)]
    trains = [r for r in records if r['type'] == 'train']
    evals = [r for r in records if r['type'] == 'eval']
    check(len(trains) == steps and len(evals) >= 2, f'the run wrote {steps} train and eval records')
    page = parse_page(out)

    def series(chart, name):
        c = series_of(page.data, chart)
        return next((s for s in c['series'] if s['name'] == name), None) if c else None

    for chart, key, name in (('loss', 'loss', f'{run} train'), ('lr', 'lr', run), ('grad_norm', 'grad_norm', run),
                             ('tokens_per_s', 'tokens_per_s', run)):
        s = series(chart, name)
        check(s is not None and s['x'] == [r['step'] for r in trains] and s['y'] == [r[key] for r in trains],
              f'{chart}: the page plots metrics.jsonl\'s {key} exactly')
    s = series('loss', f'{run} eval')
    check(s is not None and s['y'] == [r['eval_loss'] for r in evals], 'loss: the eval losses')
    unit = series_of(page.data, 'mem_host')['ylabel']
    scale = {'B': 1, 'KiB': 1024.0, 'MiB': 1024.0 ** 2, 'GiB': 1024.0 ** 3}[unit]
    for pool in ('params', 'optimizer', 'activations'):
        s = series('mem_host', f'{run} rank 0 {pool}')
        want = [r['mem_host'][pool]['peak'] / scale for r in trains]
        check(s is not None and all(abs(a - b) <= 1e-12 * b for a, b in zip(s['y'], want)),
              f'mem_host: rank 0 {pool} per-step peaks')
    check(not series_of(page.data, 'comm')['series'] or all('comm' in r for r in trains),
          'comm: a series only where the records have "comm"')
    cfg = {r[1]: r for r in page.tables['config'][0][1:]}
    check(cfg.get('model.preset', [None, None, ''])[2] == 'tiny (--set)', f'config: model.preset: {cfg.get("model.preset")}')
    check(cfg.get('steps', [None, None, ''])[2] == f'{steps} (--set)', f'config: steps: {cfg.get("steps")}')
    for c in page.data['charts']:
        w, h, rows = pngread.read(os.path.join(work, c['png']))
        check(w > 0 and h > 0, f'{c["png"]} decodes')
    return 0


if __name__ == '__main__':
    rc = main()
    if failures:
        print(f'{len(failures)} check(s) failed')
        sys.exit(1)
    print('ok' if rc == 0 else 'failed')
    sys.exit(rc)
