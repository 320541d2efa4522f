#!/bin/bash
# Checks world v4 (issue 53): every run, one after another. Each command resumes from its
# last checkpoint and skips what has finished, so after a stop start the script again:
#   setsid nohup results/checks_world_v4/campaign.sh >> runs/logs/campaign.log 2>&1 &
# Run alone on the machine (two of these at once on 2 cores are ~3x slower each).
# Logs: runs/logs/<step>.log. Status: results/checks_world_v4/README.md.
set -u
cd "$(dirname "$0")/../.."
mkdir -p runs/logs
PY=.venv/bin/python
log() { echo "$(date -Is) $*"; }
run() { local name=$1; shift; log "start $name"; /usr/bin/time -v "$@" > runs/logs/$name.log 2>&1; log "end $name rc=$?"; }
while pgrep -f "experiments.sft_generator --config=configs/sft_generator.py --workdir=runs/g_sft " >/dev/null; do sleep 30; done
run c1_gsft_final $PY -m experiments.sft_generator --config=configs/sft_generator.py --workdir=runs/g_sft --config.sft.eval_rows=64
run c2_devT $PY -m experiments.sft_generator --config=configs/sft_generator.py --workdir=runs/g_sft --config.sft.eval_rows=64 --dev_temperatures=0,1
# The list temperature of every rubric arm: the higher dev F1 (ties: greedy).
T=$($PY -c "import json; d=json.load(open('runs/g_sft/dev_temperatures.json')); print(max(d, key=lambda t: (d[t]['constraint_f1'], -float(t))))")
log "list temperature $T"
run r_gsft $PY -m experiments.report runs/g_sft --out=results/checks_world_v4/g_sft
run c4_q1a $PY -m experiments.checks_policy --config=configs/checks_policy.py --config.experiment.arms=gold,oracle,rubric_sft,rubric_g0 --config.experiment.seeds=0,1,2 --config.experiment.list_temperature=$T --config.experiment.sft_generator=runs/g_sft/export/generator '--config.experiment.trained_generator=runs/q2/seed{seed}/full/export/generator' --workdir=runs/checks_policy_v4
for s in 0 1 2; do
  run c3_q2full_s$s $PY -m experiments.ablation --config=configs/ablation.py:world=checks --config.model.generator=runs/g_sft/export/generator --config.seed=$s --config.experiment.variants=full --config.export=True --workdir=runs/q2/seed$s
done
run c4_q1b $PY -m experiments.checks_policy --config=configs/checks_policy.py --config.experiment.arms=gold,oracle,rubric_sft,rubric_trained,rubric_g0 --config.experiment.seeds=0,1,2 --config.experiment.list_temperature=$T --config.experiment.sft_generator=runs/g_sft/export/generator '--config.experiment.trained_generator=runs/q2/seed{seed}/full/export/generator' --workdir=runs/checks_policy_v4
run r_q2full $PY -m experiments.report runs/q2/seed0 runs/q2/seed1 runs/q2/seed2 --out=results/checks_world_v4/q2
run r_q1 $PY -m experiments.report runs/checks_policy_v4 --out=results/checks_world_v4/q1
run c5_ifeval_p0 $PY -m experiments.eval_ifeval --batch=32 --out=runs/ifeval_p0
for s in 0 1 2; do
  run c5_ifeval_gold_s$s $PY -m experiments.eval_ifeval --batch=32 --model=runs/checks_policy_v4/seed$s/gold/export/policy --arm=gold --run_seed=$s --baseline=runs/ifeval_p0/responses.jsonl --out=runs/ifeval_gold_s$s
done
run r_ifeval_gold $PY -m experiments.report runs/ifeval_p0 runs/ifeval_gold_s0 runs/ifeval_gold_s1 runs/ifeval_gold_s2 --out=results/checks_world_v4/ifeval
for s in 0 1 2; do
  run c6_q2abl_s$s $PY -m experiments.ablation --config=configs/ablation.py:world=checks --config.model.generator=runs/g_sft/export/generator --config.seed=$s --config.experiment.variants=full,disc_only,anchor_only --config.export=True --workdir=runs/q2/seed$s
done
for s in 0 1 2; do
  run c7_ifeval_trained_s$s $PY -m experiments.eval_ifeval --batch=32 --model=runs/checks_policy_v4/seed$s/rubric_trained/export/policy --arm=rubric_trained --run_seed=$s --baseline=runs/ifeval_p0/responses.jsonl --out=runs/ifeval_rubric_trained_s$s
done
run r_q2 $PY -m experiments.report runs/q2/seed0 runs/q2/seed1 runs/q2/seed2 --out=results/checks_world_v4/q2
run r_ifeval $PY -m experiments.report runs/ifeval_p0 runs/ifeval_gold_s0 runs/ifeval_gold_s1 runs/ifeval_gold_s2 runs/ifeval_rubric_trained_s0 runs/ifeval_rubric_trained_s1 runs/ifeval_rubric_trained_s2 --out=results/checks_world_v4/ifeval
log "campaign done"
