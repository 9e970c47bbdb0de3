#!/usr/bin/env python3
"""zt-report --follow on metrics files that grow while it watches, written by a separate process of
this test (a stand-in for zt-run: it holds metrics.jsonl open for writing and appends records, one
of them in two pieces, and a rank file that appears part way). With stdout a pipe: one plain line per
refresh that brought records (no ANSI), the values the records hold, the end found when the writer
closes the file. Also: a run that stops early (exit 3), Ctrl-C (exit 130), a corrupt line (exit 1
naming FILE:LINE), no metrics.jsonl, a finished run, and the terminal view through a pseudo-terminal.

usage: test_follow.py ZT_REPORT WORK_DIR
"""
import json
import os
import pty
import select
import shutil
import signal
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_report import check, failures, train_record  # noqa: E402

WRITER = r'''
import json, os, sys, time
sys.path.insert(0, sys.argv[1])
from test_report import train_record
run, total, stop = sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
f = open(os.path.join(run, 'metrics.jsonl'), 'a')
r1 = None
for s in range(1, stop + 1):
    line = json.dumps(train_record(s, total, 0, False, False, True)) + '\n'
    if s == 3:  # a record arrives in two writes: the follower must wait for its line end
        f.write(line[:50]); f.flush(); time.sleep(0.7)
        f.write(line[50:]); f.flush()
    else:
        f.write(line); f.flush()
    if s == 4:
        r1 = open(os.path.join(run, 'metrics.rank1.jsonl'), 'a')
    if r1:
        r1.write(json.dumps(train_record(s, total, 1, False, False, True)) + '\n'); r1.flush()
    time.sleep(0.4)
time.sleep(float(sys.argv[5]))
f.close()
'''


def start_writer(run, total, stop, linger=0.3):
    os.makedirs(run)
    w = subprocess.Popen([sys.executable, '-c', WRITER, os.path.dirname(os.path.abspath(__file__)), run, str(total),
                          str(stop), str(linger)])
    deadline = time.time() + 20
    while not os.path.exists(os.path.join(run, 'metrics.jsonl')) and time.time() < deadline:
        time.sleep(0.05)
    return w


def follow(zt_report, run, timeout=60, **kw):
    return subprocess.run([zt_report, '--follow', run, '--interval', '0.2'], capture_output=True, text=True,
                          timeout=timeout, **kw)


def main():
    zt_report, work = sys.argv[1], sys.argv[2]
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)

    # 1. a run that grows to its last step, then closes its file
    run = os.path.join(work, 'grow')
    w = start_writer(run, 8, 8)
    p = follow(zt_report, run)
    w.wait()
    print(p.stdout, p.stderr, sep='')
    lines = p.stdout.splitlines()
    check(p.returncode == 0, f'follow: exit 0 when the run finishes (got {p.returncode})')
    check('\x1b' not in p.stdout, 'follow on a pipe: no ANSI sequences')
    check(lines and lines[-1] == 'zt-report: the run finished: step 8/8 (its process closed metrics.jsonl)',
          f'follow: the last line says the run finished and how that was found: {lines[-1:]}')
    views = lines[:-1]
    steps = [int(v.split()[1].split('/')[0]) for v in views if v.startswith('step ')]
    check(len(views) == len(steps) and len(steps) >= 4, f'follow: one status line per refresh with news: {views}')
    check(steps == sorted(steps) and len(set(steps)) == len(steps) and steps[-1] == 8,
          f'follow: steps only go forward, each line news, ending at 8: {steps}')
    check(all(v.startswith(f'step {s}/8 ') for v, s in zip(views, steps)), 'follow: step/total on every line')
    for v, s in zip(views, steps):
        rec = train_record(s, 8, 0, False, False, True)
        check(f'| loss {rec["loss"]:.4f} |' in v, f'follow: step {s} shows loss {rec["loss"]:.4f}: {v}')
        check(f'comm r0 {100 * rec["comm"]["share"]:.1f}%' in v, f'follow: step {s} shows rank 0\'s comm share: {v}')
        check(' r0 host ' in v, f'follow: step {s} shows rank 0\'s host memory: {v}')
    last = views[-1] if views else ''
    r1 = train_record(8, 8, 1, False, False, True)
    check(' r1 host ' in last and f'r1 {100 * r1["comm"]["share"]:.1f}%' in last,
          f'follow: the rank file that appeared is followed: {last}')
    check('ETA' in last and 'tok/s' in last, f'follow: tokens/s and ETA: {last}')

    # 2. a run whose process ends before its last step
    run = os.path.join(work, 'early')
    w = start_writer(run, 8, 2)
    p = follow(zt_report, run)
    w.wait()
    check(p.returncode == 3 and 'the run stopped at step 2 of 8' in p.stdout,
          f'follow: exit 3 when the run stops early: {p.returncode} {p.stdout[-200:]}')

    # 3. Ctrl-C
    run = os.path.join(work, 'interrupt')
    w = start_writer(run, 8, 1, linger=30)
    f = subprocess.Popen([zt_report, '--follow', run, '--interval', '0.2'], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    time.sleep(1.0)
    f.send_signal(signal.SIGINT)
    out, _ = f.communicate(timeout=20)
    w.kill()
    w.wait()
    check(f.returncode == 130 and out.startswith('step 1/8'), f'follow: Ctrl-C exits 130: {f.returncode} {out!r}')

    # 4. a corrupt line that is not the last
    run = os.path.join(work, 'corrupt')
    os.makedirs(run)
    with open(os.path.join(run, 'metrics.jsonl'), 'w') as fh:
        fh.write(json.dumps(train_record(1, 4)) + '\n{"step":2,"type":"tr\n' + json.dumps(train_record(3, 4)) + '\n')
    p = follow(zt_report, run)
    check(p.returncode == 1 and f'{run}/metrics.jsonl:2' in p.stderr,
          f'follow: a corrupt line is an error naming FILE:LINE: {p.returncode} {p.stderr}')

    # 5. no metrics.jsonl; a missing directory
    run = os.path.join(work, 'none')
    os.makedirs(run)
    p = follow(zt_report, run)
    check(p.returncode == 1 and 'holds no metrics.jsonl' in p.stderr, f'follow: no metrics.jsonl: {p.stderr}')
    p = follow(zt_report, os.path.join(work, 'missing'))
    check(p.returncode == 1 and 'No such file or directory' in p.stderr, f'follow: a missing dir: {p.stderr}')

    # 6. a finished run with a torn last line, nobody writing: shown once, with a note, and done
    run = os.path.join(work, 'done')
    os.makedirs(run)
    with open(os.path.join(run, 'metrics.jsonl'), 'w') as fh:
        for s in (1, 2):
            fh.write(json.dumps(train_record(s, 2)) + '\n')
        fh.write('{"step":3,"ty')
    p = follow(zt_report, run)
    check(p.returncode == 0 and p.stdout.startswith('step 2/2 ') and 'finished' in p.stdout and
          f'{run}/metrics.jsonl:3: a torn last line' in p.stderr,
          f'follow: a finished run is shown once, its torn line noted: {p.returncode} {p.stdout!r} {p.stderr!r}')

    # 7. on a terminal: redrawn in place with clear + home, memory as a table
    master, slave = pty.openpty()
    f = subprocess.Popen([zt_report, '--follow', run, '--interval', '0.2'], stdout=slave, stderr=subprocess.PIPE)
    os.close(slave)
    out = b''
    deadline = time.time() + 20
    while time.time() < deadline:
        r, _, _ = select.select([master], [], [], 0.5)
        if r:
            try:
                chunk = os.read(master, 65536)
            except OSError:
                break
            if not chunk:
                break
            out += chunk
        elif f.poll() is not None:
            break
    f.wait(timeout=20)
    os.close(master)
    text = out.decode(errors='replace')
    check(text.startswith('\x1b[H\x1b[2J') and 'memory (per-step peak)' in text and 'rank 0   host' in text,
          f'follow on a terminal: clear+home, a memory table: {text[:300]!r}')
    check('communication: no communication data' in text, 'follow on a terminal: says when there is no comm data')


if __name__ == '__main__':
    main()
    if failures:
        print(f'{len(failures)} check(s) failed')
        sys.exit(1)
    print('ok')
