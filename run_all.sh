#!/usr/bin/env bash
# run_all.sh: every experiment of the paper, one literal command per method, each seed its own run directory.
#
#   bash run_all.sh --dry-run                 # print the whole paper grid and its run count; run nothing
#   bash run_all.sh [--only main|ablations|clusters|sft|aux_rl|released|reference|webshop] [--7b]  # paper grid, 8 GPUs
#   bash run_all.sh --cpu                     # the same grid at toy scale on a CPU (preset cpu, 2 seeds)
#   bash run_all.sh --cpu --smoke             # every grid entry for one step on a minimal budget (CI)
#   bash run_all.sh --cpu --only pick2        # the pick-two regime's comparison (preset cpu_pick2), 17 runs
#   bash run_all.sh --cpu --only mix6         # the mixed regime: six task types, held-out games (cpu_mix6), 34 runs
#   bash run_all.sh --cpu --only why          # why the hints do not transfer there: docs/results.md §9, 12 runs
#   bash run_all.sh --cpu --only aux_rl       # Table 1's Aux-RL row in the mixed regime: docs/results.md §12, 7 runs
#
# A run whose directory holds summary.json (written by train.py when it finishes) is skipped, so the script resumes
# after an interruption; an unfinished run resumes from its last checkpoint (--resume auto). RUN_ROOT=DIR puts
# the run directories elsewhere. At the end:
# `python eval.py table` over the runs (one Markdown table per setting) and the dynamics figure of the main runs.
# --cpu copies each finished run's summary.json and log.jsonl to results/cpu/toy/<run>/ (the toy grid) or
# results/cpu/<regime>/<run>/ (pick2, mix6), which the repo keeps, so `python eval.py table results/cpu/toy`
# and `python eval.py table results/cpu/<regime>` rebuild the README's tables, and `python eval.py dynamics` their
# figures, on any machine.
#
# Measured toy scale (2-core CPU, docs/results.md): one 40-step --cpu run of the ALFWorld rows
# takes 14-28 minutes (GRPO 28 min, step decay 14 min, target-acc 28 min with the machine to itself; Agent-G² 22.5
# / 24.2 min with some tests beside it) and up to ~48 minutes when other work shares the cores. Binary search (M=2)
# plays ~60 probe rollouts per step on top of the 64 trained on and took 43-45 min. Enumeration probes every depth:
# both seeds played 478 rollouts per step for the 64 trained on, at 194 and 189 s/step (2.1-2.2 h for 40). 48 runs
# x ~25 min is ~20 hours before enumeration: the --cpu grid resumes, so it can be run in parts.
# Measured pick-two scale (--only pick2, 2-core CPU, docs/results.md §5): one 150-step run takes 18-24 minutes, binary
# search 34-37 (~52 probe rollouts per step on top of the 64). Enumeration plays ~750 rollouts per step (every depth
# 0..L-1 of each task, 4 each): its first 51 steps took 73 s each (61-92), ~3 hours for 150 before evaluations.
# --cpu --smoke (CI): 24 one-step runs at --max_steps 15 (the policy acts after the hint), 189 s for the whole
# test (grid + resume check, 2-core CPU, 2026-12-01); 337 s measured earlier at --max_steps 4.
set -euo pipefail
cd "$(dirname "$0")"

MODE=gpu DRY=0 SMOKE=0 ONLY="" SEVEN=0
while [ $# -gt 0 ]; do
    case "$1" in
        --dry-run) DRY=1 ;;
        --cpu) MODE=cpu ;;
        --smoke) SMOKE=1 ;;
        --only) ONLY="$2"; shift ;;
        --7b) SEVEN=1 ;;
        *) echo "run_all.sh: unknown option $1 (see the header of this file)" >&2; exit 2 ;;
    esac
    shift
done
case "$ONLY" in ""|main|ablations|clusters|sft|aux_rl|released|reference|webshop|pick2|mix6|why) ;;
    *) echo "run_all.sh: --only main|ablations|clusters|sft|aux_rl|released|reference|webshop|pick2|mix6|why" >&2
       exit 2 ;; esac
case "$ONLY" in pick2|mix6|why) [ "$MODE" = cpu ] || { echo "run_all.sh: --only $ONLY goes with --cpu" >&2; exit 2; } ;; esac
[ "$SMOKE" = 1 ] && [ "$MODE" != cpu ] && { echo "run_all.sh: --smoke goes with --cpu" >&2; exit 2; }

if [ "$MODE" = gpu ]; then
    SEEDS="0 1 2 3 4"; ROOT=${RUN_ROOT:-runs/paper_grid}; PRESET=paper; RESULTS=""
    LAUNCH="torchrun --standalone --nproc_per_node=${NPROC:-8} train.py"
    # the authors' expert trajectories (their sft_data/, also on their Hugging Face dataset
    # xiamoent/Agent-G2-ALFWorld-Webshop-sft-data): the hints the paper used, with a think per step
    EXPERT_DATA=${EXPERT_DATA:-data/sft_data} MILESTONES=${MILESTONES:-data/beacon/alfworld.json}
    ALF=(--expert_data "$EXPERT_DATA/alfworld_sft_data.json")
    if [ "$DRY" = 0 ] && [ ! -f "$EXPERT_DATA/alfworld_sft_data.json" ]; then
        echo "run_all.sh: no $EXPERT_DATA/alfworld_sft_data.json: put the authors' sft_data/ files there (their" \
             "repository ZJU-REAL/Agent-G2 or the Hugging Face dataset xiamoent/Agent-G2-ALFWorld-Webshop-sft-data)," \
             "or set EXPERT_DATA to their folder" >&2
        exit 2
    fi
else
    SEEDS="0 1"; ROOT=${RUN_ROOT:-runs/cpu_grid}; PRESET=cpu; RESULTS=results/cpu/toy
    LAUNCH="python train.py"; ALF=()
fi
EXTRA=()
if [ "$SMOKE" = 1 ]; then  # one step, tiny budget, HF engine (no vLLM start-up), no evaluation; --max_steps 15 leaves
    # the policy room after the scheduled hint (with 4 the hint fills the budget and the policy makes 0 tokens)
    SEEDS="0"; ROOT=${RUN_ROOT:-runs/smoke_grid}
    EXTRA=(--steps 1 --batch_tasks 2 --group_size 2 --max_steps 15 --eval_games -1 --train_panel 0 --num_workers 1
           --engine hf --ckpt_every 0)
fi
N=0 DONE=0

run() {  # run GROUP NAME FLAGS...: one grid entry for the current seed $s
    local group=$1 name=$2; shift 2
    [ -n "$ONLY" ] && [ "$ONLY" != "$group" ] && return 0
    local out="$ROOT/$name/s$s"
    N=$((N + 1))
    local data=("${ALF[@]}") preset=(--preset "$PRESET")  # ALFWorld's expert data (the GPU grid) and the grid's
    [[ " $* " == *" --expert_data "* ]] && data=()       # preset, unless the entry names its own
    [[ " $* " == *" --preset "* ]] && preset=()
    local cmd=($LAUNCH "${preset[@]}" --seed "$s" --out_dir "$out" "${data[@]}" "$@" "${EXTRA[@]}")
    if [ "$DRY" = 1 ]; then echo "${cmd[*]}"; return 0; fi
    if [ -f "$out/summary.json" ]; then  # finished: keep its results if they are not kept yet
        echo "[run_all] done already: $out"; DONE=$((DONE + 1))
        [ -f "$RESULTS/$name/s$s/summary.json" ] || keep
        return 0
    fi
    local resume=()
    ls -d "$out"/ckpt_* >/dev/null 2>&1 && resume=(--resume auto)
    # a partial run without a checkpoint cannot be continued: start it again (train.py refuses silently reusing it)
    [ ${#resume[@]} = 0 ] && [ -f "$out/log.jsonl" ] && resume=(--overwrite 1)
    echo "[run_all] $(date -u +%H:%M:%S) ${cmd[*]} ${resume[*]}"
    "${cmd[@]}" "${resume[@]}"
    keep
}

keep() {  # --cpu: a finished run's summary and log into results/ (the repository keeps them); reads run's locals
    [ "$MODE" = cpu ] && [ "$SMOKE" = 0 ] || return 0
    mkdir -p "$RESULTS/$name/s$s" && cp "$out/summary.json" "$out/log.jsonl" "$RESULTS/$name/s$s/"
}

aux_flags() {  # aux_flags NAME: the Aux-RL rows' own flags (config.METHODS' aux_rl group, rlvmr_ref): the cold
    # start's tagged file and budget (GPU: RLVMR's 200 trajectories x 5 epochs at lr 1e-5; CPU: the 240 built-in
    # games x 5 epochs at the SFT base's lr), or, for the RL rows, the cold start's final checkpoint
    local cold=(--train_games 200 --steps 63 --lr 1e-5) n=63
    [ "$MODE" = cpu ] && cold=(--steps 75 --lr 1e-3 --eval_every 0) n=75
    case "$1" in
        rlvmr_cold) echo --expert_data "$(tagged)" "${cold[@]}" ;;
        rlvmr|grpo_cold|rlvmr_ref) echo --model "$ROOT/rlvmr_cold/s0/ckpt_$(printf %06d $n)" ;;
    esac
}

tagged() {  # RLVMR's tagged trajectories: TAGGED=FILE in its format (variants/formats.py; its own annotated data
    # is not released), else the stand-in built here from the training games' walkthroughs, tagged by rule
    if [ -n "${TAGGED:-}" ]; then echo "$TAGGED"; return 0; fi
    local f=$ROOT/rlvmr_standin.json
    if [ "$DRY" = 0 ] && [ ! -f "$f" ]; then
        mkdir -p "$ROOT" && python -m variants.formats standin --out "$f" \
            --games "$([ "$MODE" = gpu ] && echo official || echo builtin)" >&2
    fi
    echo "$f"
}

# the methods and their flags: config.METHODS, the one list (eval.py's tables and tools/bench.py read it too)
NAMES=(); declare -A FLAGS GROUP
while IFS=$'\t' read -r name group flags; do NAMES+=("$name"); GROUP[$name]=$group; FLAGS[$name]=$flags
done < <(python config.py methods)

for s in $SEEDS; do
    for name in "${NAMES[@]}"; do
        group=${GROUP[$name]} flags=(${FLAGS[$name]})
        case "$group" in
            main|ablations|clusters|sft) ;;  # docs/method.md §3-§4: paper Tables 1-3 and 8, the SFT baselines
            aux_rl)  # RLVMR (docs/method.md §3.2): one cold start (seed 0), the RL rows from it; CPU: --only aux_rl
                [ "$MODE" = gpu ] || continue
                [ "$name" = rlvmr_cold ] && [ "$s" != 0 ] && continue
                flags+=($(aux_flags "$name")) ;;
            released)  # the authors' released code (method §2.1): their launchers' presets on the GPU grid, their
                       # depth rules on the CPU one
                if [ "$MODE" = gpu ]; then [ "$name" = released_rules ] && continue
                else [ "$name" != released_rules ] && continue; fi ;;
            webshop) ;;
            reference) [ "$MODE" = gpu ] || continue  # GiGPO's, BEACON's and RLVMR's own protocols (config/*_ref.py)
                flags+=($(aux_flags "$name")) ;;
            *) continue ;;  # hints (the pick-two regime, below), beyond (python -m tools.bench sched)
        esac
        case "$name" in *_7b) { [ "$MODE" = gpu ] && [ "$SEVEN" = 1 ]; } || continue ;; esac  # Qwen2.5-7B: --7b
        # BEACON's milestones on the GPU grid: its migpo/alfworld.json where there (MILESTONES=FILE), else each
        # task's expert actions (the run's start-up log says which)
        case "$name" in beacon*) if [ "$MODE" = gpu ] && [ -f "$MILESTONES" ]; then
                                     flags+=(--milestones "$MILESTONES"); fi ;; esac
        if [[ $name == ws_* ]]; then
            # WebShop (method §5): the official environment on the GPU grid (WEBSHOP_PATH, `python envs.py
            # webshop-doctor`) in the authors' setting (the paper preset's webshop_setting / webshop_split), their
            # launcher's 15 steps and mini-batches of 64, validation on their 500 goals, their expert data; on the
            # CPU the offline webshop-lite site (labelled so, never WebShop's) from its own SFT base
            # (config/cpu_webshop.py; the later --preset wins), GRPO and Agent-G² only
            if [ "$MODE" = gpu ]; then
                ws=(--expert_data "$EXPERT_DATA/webshop_sft_data.json")
                [ "$name" = ws_released ] || ws=(--env webshop --webshop_backend official --max_steps 15
                                                 --ppo_mini_batch 64 --eval_split eval "${ws[@]}")
            else
                [ "$name" = ws_g2 ] || [ "$name" = ws_grpo ] || continue
                ws=(--preset cpu_webshop)
            fi
            flags=("${ws[@]}" "${flags[@]}")
        fi
        run "$group" "$name" "${flags[@]}"
    done
done

# ---- the CPU regimes (--cpu --only pick2 | mix6): long tasks from a base that rarely wins them, each chosen from
#      the base's and plain GRPO's probes before any Agent-G² run in it (docs/cpu-demo.md). PLAN: each method with
#      its seeds, under the regime's preset (its own rule is Agent-G²), in the run directories docs/results.md names
#      (runs/cpu_<regime>/<method>/s<seed>), seed by seed so that a stopped grid has whole seeds.
#      pick2 (docs/results.md §5): Agent-G² and GRPO 3 seeds, four schedules 2, enumeration 1, and seed 0 of the
#      hint sources' two runs (half the tasks without an expert trajectory, hinted by the policy's own wins or left
#      unhinted). mix6 (docs/results.md §8): all six task types, held-out games; Agent-G² and GRPO 5 seeds, the
#      scalar schedules, the probe (binary search) and the ablations sigma = 0, uniform, K = 1, eta = 0 with 3;
#      Table 1's hint-free rows GiGPO, BEACON and Agent-G² + GiGPO with 3 (docs/results.md §11).
#      aux_rl (docs/results.md §12, written before its runs): under cpu_mix6, RLVMR's stand-in cold start (seed 0),
#      then RLVMR and GRPO from it, seeds 0-2 each, in RLVMR's format's short form for the tiny model.
#      why (docs/results.md §9, written down before these runs): under cpu_mix6, seeds 0-2 each, a share of each
#      batch played hint-free (b), L_aux alone with a training panel (c), Agent-G² and GRPO for 300 steps (d).
declare -A WHY=([hint_free]="--scheduler g2_hint_free" [aux_only]="--mode aux_only --train_panel 48"
                [g2_300]="--steps 300" [grpo_300]="--scheduler none --steps 300")
case "$ONLY" in
    why) PLAN="hint_free:012 aux_only:012 g2_300:012 grpo_300:012" ;;
    pick2) PLAN="g2:012 grpo:012 fixed:01 linear:01 target_acc:01 binary:01 enum:0 self_hints:0 half_hints:0" ;;
    mix6) PLAN="g2:01234 grpo:01234 fixed:012 linear:012 target_acc:012 binary:012 no_sampling:012 uniform:012"
          PLAN="$PLAN K1:012 no_aux:012 gigpo:012 beacon:012 g2_gigpo:012 rlvmr_cold:0 rlvmr:012 grpo_cold:012" ;;
    aux_rl) if [ "$MODE" = cpu ]; then PLAN="rlvmr_cold:0 rlvmr:012 grpo_cold:012"; else PLAN=""; fi ;;
    *) PLAN="" ;;
esac
if [ -n "$PLAN" ]; then
    PRESET=cpu_$ONLY ROOT=${RUN_ROOT:+$RUN_ROOT/$ONLY} RESULTS=results/cpu/$ONLY
    [ "$ONLY" = why ] && PRESET=cpu_mix6
    [ "$ONLY" = aux_rl ] && PRESET=cpu_mix6 ROOT=${RUN_ROOT:+$RUN_ROOT/mix6} RESULTS=results/cpu/mix6
    ROOT=${ROOT:-runs/$PRESET}
    for s in 0 1 2 3 4; do
        for entry in $PLAN; do
            name=${entry%%:*}
            [[ ${entry#*:} == *$s* ]] || continue
            if [ "$ONLY" = why ]; then flags=(${WHY[$name]})
            elif [ "$name" = g2 ]; then flags=()  # the preset's own rule is Agent-G²
            else flags=(${FLAGS[$name]}); fi
            case "$name" in rlvmr_cold|rlvmr|grpo_cold)  # the tiny model: the format's short form, its replies
                flags+=($(aux_flags "$name") --prompt rlvmr_compact --max_new_tokens 48) ;; esac
            run "$ONLY" "$name" "${flags[@]}"
        done
    done
    SEEDS="$PLAN"
fi

if [ "$DRY" = 1 ]; then echo "# $N runs ($MODE$([ "$SMOKE" = 1 ] && echo ", smoke"), seeds: $SEEDS)"; exit 0; fi
echo "[run_all] $N runs, $DONE were done already"
[ "$SMOKE" = 1 ] && exit 0
d=$([ "$MODE" = gpu ] && echo "$ROOT" || echo "$RESULTS")
python eval.py table "$d"
if ls "$d"/g2/s*/log.jsonl "$d"/grpo/s*/log.jsonl >/dev/null 2>&1; then  # the figure needs both methods' runs
    python eval.py dynamics "$d"/g2/s* "$d"/grpo/s* --out "$d/dynamics.png"
fi
