#!/usr/bin/env bash
# The lab deployment (docker-compose.yml), end to end on a real Docker engine:
#
#   1. starts a Docker engine if none answers (Debian's docker.io, installed if missing);
#   2. builds the two images, on the base images named by PYTHON_IMAGE, POSTGRES_IMAGE and
#      REDIS_IMAGE, or, when Docker Hub's cannot be had, on stand-ins made from Debian packages
#      (deploy/standins/build.sh), with MTFL_PLUGINS=./examples/custom-task in its .env and a
#      root-owned host folder as ARTIFACT_SOURCE;
#   3. brings the stack up with the `cpu` profile's agent and times it until every container is
#      healthy;
#   4. creates a user and a token, checks that anonymous API and schema requests are refused, and
#      runs a small experiment (the light template, digits, on the CPU agent) through the REST API,
#      restarting the control worker and Redis while the agent trains its first round; the run
#      must succeed with every round and assignment counted once, its weights written to the
#      host folder as uid 1000;
#   5. rebuilds without MTFL_PLUGINS in the environment and checks `mtfl plugins` still lists the
#      plug-in (the setting is read from .env, not from the shell that builds);
#   6. tears down what it made, by ID (containers, volumes, networks, and the images it built
#      unless --keep-images; a Docker engine it started is stopped), and prints one line of
#      figures last:
#        compose_check=ok build_s=... up_healthy_s=... image_mb=... agent_image_mb=... cuda_only_mb=... run_s=...
#
# Not part of .ci/run: a cold build downloads torch (several minutes). Run as root from any folder:
#   deploy/compose_check.sh [--keep-images] [--keep-on-failure] [--json FILE]
# --json FILE also appends the figures, with the versions and base images, to a results file
# (benchmarks/results/compose_check.json keeps the runs on record).
# Environment: COMPOSE (the compose command; default `docker compose` where the v2 plugin is
# installed, else `docker-compose`), PYTHON_IMAGE/POSTGRES_IMAGE/REDIS_IMAGE (base images),
# CONTROLPLANE_TORCH_INDEX_URL (a CPU-only torch index for the control-plane image),
# CHECK_ROUNDS (default 2), CHECK_TIMEOUT_S (the run's limit, default 900).
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
cd "$repo"

keep_images=0
keep_on_failure=0
json_out=""
while [ $# -gt 0 ]; do
  case $1 in
    --keep-images) keep_images=1 ;;
    --keep-on-failure) keep_on_failure=1 ;;
    --json) json_out=${2:?--json needs a file}; shift ;;
    -h | --help) sed -n '2,29p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "compose_check: unknown argument $1 (allowed: --keep-images, --keep-on-failure, --json FILE)" >&2; exit 2 ;;
  esac
  shift
done
json_arg=$json_out
[ -z "$json_out" ] || json_out=$(realpath -m "$json_out")

log() { echo "compose_check: $*" >&2; }
die() { log "FAILED: $*"; exit 1; }
now() { date +%s.%N; }
elapsed() { python3 -c "import sys; print(f'{float(sys.argv[2]) - float(sys.argv[1]):.0f}')" "$1" "$(now)"; }

# ---- teardown, by ID, whatever happens -------------------------------------------------------
# Set before anything is made: each step below registers what it made (dockerd, the work folder,
# the compose project), and the trap removes exactly that, step by step, none stopping the rest.
status=failed
started_dockerd=""
work=""
project=""
teardown() {
  local code=$?
  set +e
  if [ "$status" != ok ] && [ "$keep_on_failure" = 1 ] && [ -n "$project" ]; then
    log "kept for a look (--keep-on-failure): project $project, .env $env_file"
    return "$code"
  fi
  if [ -n "$project" ]; then
    if [ "$status" != ok ]; then
      log "last log lines of each service:"
      compose logs --no-color --tail 30 2>&1 | sed 's/^/  /' >&2
    fi
    local label=com.docker.compose.project=$project ids
    ids=$(docker ps -aq --filter "label=$label")
    [ -z "$ids" ] || docker rm -f $ids >/dev/null || log "could not remove containers $ids"
    ids=$(docker volume ls -q --filter "label=$label")
    [ -z "$ids" ] || docker volume rm $ids >/dev/null || log "could not remove volumes $ids"
    ids=$(docker network ls -q --filter "label=$label")
    [ -z "$ids" ] || docker network rm $ids >/dev/null || log "could not remove networks $ids"
    if [ "$keep_images" = 0 ]; then
      # By name and without -f: an image another tag also names (an identical cached build an
      # admin tagged) keeps that tag; only this run's goes.
      for image in "mtfl-lab-controlplane:$tag" "mtfl-lab-agent:$tag"; do
        if docker image inspect "$image" >/dev/null 2>&1; then
          docker rmi "$image" >/dev/null || log "could not remove image $image"
        fi
      done
    fi
    log "torn down: project $project"
  fi
  [ -z "$work" ] || rm -rf --one-file-system "$work"
  if [ -n "$started_dockerd" ]; then
    kill "$started_dockerd" 2>/dev/null
    wait "$started_dockerd" 2>/dev/null
    log "stopped the dockerd it started"
  fi
  return "$code"
}
trap teardown EXIT

[ "$(id -u)" = 0 ] || die "run as root (it may start dockerd and install Debian packages)"
apt_install() {  # apt_install PACKAGE...: from the package lists, refreshed once if that fails
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@" >/dev/null \
    || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@" >/dev/null; }
}

# ---- 1. a Docker engine ----------------------------------------------------------------------
if ! docker info >/dev/null 2>&1; then
  if ! command -v dockerd >/dev/null; then
    log "installing Debian's docker.io"
    apt_install docker.io
  fi
  log "starting dockerd"
  dockerd_log=$(mktemp /tmp/compose-check-dockerd.XXXXXX)
  dockerd >"$dockerd_log" 2>&1 &
  started_dockerd=$!
  for _ in $(seq 60); do docker info >/dev/null 2>&1 && break; sleep 1; done
  docker info >/dev/null 2>&1 || die "dockerd did not answer within 60 s; its log: $dockerd_log"
fi
if [ -z "${COMPOSE:-}" ]; then
  if docker compose version >/dev/null 2>&1; then
    COMPOSE="docker compose"
  elif command -v docker-compose >/dev/null; then
    COMPOSE="docker-compose"
  else
    log "installing Debian's docker-compose"
    apt_install docker-compose
    COMPOSE="docker-compose"
  fi
fi
log "engine: dockerd $(docker version -f '{{.Server.Version}}'); compose: $($COMPOSE version --short 2>/dev/null || $COMPOSE version | head -1)"

# ---- 2. base images and the check's .env -----------------------------------------------------
have_image() { docker image inspect "$1" >/dev/null 2>&1; }
obtainable() { have_image "$1" || timeout 120 docker pull -q "$1" >/dev/null 2>&1; }
python_image=${PYTHON_IMAGE:-python:3.11-slim}
postgres_image=${POSTGRES_IMAGE:-postgres:16}
redis_image=${REDIS_IMAGE:-redis:7}
if ! obtainable "$python_image" || ! obtainable "$postgres_image" || ! obtainable "$redis_image"; then
  log "$python_image, $postgres_image or $redis_image cannot be had: stand-ins from Debian packages"
  "$repo/deploy/standins/build.sh"
  obtainable "$python_image" || python_image=mtfl-standin/python:3.11-slim
  obtainable "$postgres_image" || postgres_image=mtfl-standin/postgres:15
  obtainable "$redis_image" || redis_image=mtfl-standin/redis:7
fi
log "base images: $python_image, $postgres_image, $redis_image"

free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
secret() { python3 -c 'import secrets; print(secrets.token_urlsafe(24))'; }
tag=check$$
work=$(mktemp -d /tmp/compose-check.XXXXXX)
chmod 755 "$work"
# A host folder for the weights, root's as an admin's mkdir makes it: the containers (uid 1000)
# must take it over themselves (deploy/entrypoint.sh).
mkdir -m 755 "$work/artifacts"
web_port=$(free_port)
env_file=$work/.env
# The .env holds the stack's secrets: readable by root alone.
touch "$env_file" && chmod 600 "$env_file"
controlplane_torch_index=${CONTROLPLANE_TORCH_INDEX_URL:-}
# Every variable from .env.example, the secrets and ports replaced: the file a lab admin fills in.
sed -e "s|^SECRET_KEY=.*|SECRET_KEY=$(secret)|" \
    -e "s|^POSTGRES_PASSWORD=.*|POSTGRES_PASSWORD=$(secret)|" \
    -e "s|^REDIS_PASSWORD=.*|REDIS_PASSWORD=$(secret)|" \
    -e "s|^FLOWER_BASIC_AUTH=.*|FLOWER_BASIC_AUTH=admin:$(secret)|" \
    -e "s|^ALLOWED_HOSTS=.*|ALLOWED_HOSTS=localhost,127.0.0.1|" \
    -e "s|^WEB_PUBLISH=.*|WEB_PUBLISH=127.0.0.1:$web_port|" \
    -e "s|^REDIS_PUBLISH=.*|REDIS_PUBLISH=127.0.0.1:$(free_port)|" \
    -e "s|^FLOWER_PUBLISH=.*|FLOWER_PUBLISH=127.0.0.1:$(free_port)|" \
    -e "s|^MTFL_IMAGE_TAG=.*|MTFL_IMAGE_TAG=$tag|" \
    -e "s|^MTFL_PLUGINS=.*|MTFL_PLUGINS=./examples/custom-task|" \
    -e "s|^PYTHON_IMAGE=.*|PYTHON_IMAGE=$python_image|" \
    -e "s|^POSTGRES_IMAGE=.*|POSTGRES_IMAGE=$postgres_image|" \
    -e "s|^REDIS_IMAGE=.*|REDIS_IMAGE=$redis_image|" \
    -e "s|^CONTROLPLANE_TORCH_INDEX_URL=.*|CONTROLPLANE_TORCH_INDEX_URL=$controlplane_torch_index|" \
    -e "s|^MTFL_CPU_AGENT_DEVICE=.*|MTFL_CPU_AGENT_DEVICE=cpu-check|" \
    -e "s|^MTFL_ROUND_CHECK_S=.*|MTFL_ROUND_CHECK_S=5|" \
    -e "s|^ARTIFACT_SOURCE=.*|ARTIFACT_SOURCE=$work/artifacts|" \
    .env.example >"$env_file"
# The compose file's own variables come from the .env alone, never from this shell.
for name in $(grep -o '^[A-Z][A-Z0-9_]*' .env.example); do unset "$name"; done
compose() { $COMPOSE --env-file "$env_file" -p "$project" -f "$repo/docker-compose.yml" --profile cpu "$@"; }
project=mtflcheck$$


# ---- 3. build, then up -----------------------------------------------------------------------
t0=$(now)
log "building the images (tag $tag; a cold build downloads torch)"
compose build >"$work/build.log" 2>&1 || { tail -40 "$work/build.log" >&2; die "the build failed"; }
build_s=$(elapsed "$t0")
# Cold: pip downloaded torch (no cached layer had it).
cold_build=$(grep -q 'Downloading torch-' "$work/build.log" && echo True || echo False)
log "built in ${build_s} s (cold: $cold_build)"

t0=$(now)
compose up -d >"$work/up.log" 2>&1 || { cat "$work/up.log" >&2; die "up -d failed"; }
services="postgres redis web worker flower agent-cpu"
wait_healthy() {  # wait_healthy LIMIT_S: every service's container healthy
  local deadline=$((SECONDS + $1)) service id health pending
  while :; do
    pending=""
    for service in $services; do
      id=$(compose ps -q "$service")
      health=$([ -n "$id" ] && docker inspect -f '{{if .State.Health}}{{.State.Health.Status}}{{else}}none{{end}}' "$id" || echo missing)
      [ "$health" = healthy ] || pending="$pending $service=$health"
    done
    [ -z "$pending" ] && return 0
    [ $SECONDS -lt $deadline ] || die "not healthy after $1 s:$pending"
    sleep 2
  done
}
wait_healthy 300
up_healthy_s=$(elapsed "$t0")
log "every service healthy ${up_healthy_s} s after up -d"

# ---- 4. a user, a token, an experiment through the API ---------------------------------------
base=http://127.0.0.1:$web_port
compose exec -T -e DJANGO_SUPERUSER_PASSWORD="$(secret)" web \
  mtfl createsuperuser --noinput --username check --email check@lab.example >/dev/null
token=$(compose exec -T web mtfl drf_create_token check | grep -oE '\b[0-9a-f]{40}\b' | head -1)
[ -n "$token" ] || die "no token"
api() {  # api METHOD PATH [JSON]: the response body; fails on an HTTP error, printing the body
  local out
  out=$(curl -sS -o "$work/body" -w '%{http_code}' -X "$1" -H "Authorization: Token $token" \
    -H 'Content-Type: application/json' ${3:+--data "$3"} "$base$2")
  case $out in 2??) cat "$work/body" ;; *) log "$1 $2 answered $out: $(head -c 2000 "$work/body")"; return 1 ;; esac
}
field() { python3 -c "import json, sys; d = json.load(sys.stdin); print(eval(sys.argv[1], {}, {'d': d}))" "$1"; }

for path in /api/experiments/ /api/schema/; do
  anonymous=$(curl -s -o /dev/null -w '%{http_code}' "$base$path")
  [ "$anonymous" = 401 ] || die "an anonymous GET $path answered $anonymous, not 401"
done
# The agent is healthy once it holds its lock; its device registers over the broker soon after.
device_id=""
for _ in $(seq 60); do
  device_id=$(api GET "/api/devices/?limit=1000" | field "next((x['id'] for x in d['results'] if x['name'] == 'cpu-check'), '')")
  [ -n "$device_id" ] && break
  sleep 1
done
[ -n "$device_id" ] || die "the CPU agent's device cpu-check did not register within 60 s"
plugins=$(api GET /api/plugins/)
[[ $plugins == *tabular_mlp* ]] || die "the control plane lists no custom-task plug-in: $plugins"
rounds=${CHECK_ROUNDS:-2}
experiment_id=$(api POST /api/experiments/from-template/ \
  "{\"template\": \"light\", \"devices\": [$device_id], \"name\": \"compose check\", \"rounds\": $rounds}" | field "d['id']")
t0=$(now)
run_id=$(api POST "/api/experiments/$experiment_id/runs/" '{"strategy": "sharing"}' | field "d['id']")
log "run $run_id of experiment $experiment_id ($rounds rounds, light template, device cpu-check)"

run_status() { api GET "/api/runs/$run_id/" | field "d['status']"; }
# Once the agent has taken its first round's training task, restart the control worker, then
# Redis, under it: the round's result must still be counted, once.
# (The logs are read whole before grep: `grep -q` quitting early would fail the pipe.)
training() { compose logs --no-color agent-cpu 2>/dev/null | grep -c 'mtfl.train_round\[.*\] received' || true; }
for _ in $(seq 300); do
  [ "$(training)" -ge 1 ] && break
  sleep 1
done
[ "$(training)" -ge 1 ] || die "the agent received no training task within 300 s"
log "the agent is training round 0: restarting the control worker"
compose restart worker >/dev/null 2>&1
log "restarting Redis"
compose restart redis >/dev/null 2>&1
deadline=$((SECONDS + ${CHECK_TIMEOUT_S:-900}))
while :; do
  state=$(run_status)
  case $state in succeeded) break ;; failed | cancelled | partial) die "the run ended $state" ;; esac
  [ $SECONDS -lt $deadline ] || die "the run is still $state after ${CHECK_TIMEOUT_S:-900} s"
  sleep 3
done
run_s=$(elapsed "$t0")
counted=$(api GET "/api/rounds/?run=$run_id&limit=1000" \
  | field "sorted(r['index'] for r in d['results'] if r['status'] == 'succeeded')")
expected=$(python3 -c "print(list(range($rounds)))")
[ "$counted" = "$expected" ] || die "rounds counted $counted, expected $expected, each once"
tasks=$(api GET "/api/experiments/$experiment_id/" | field "len(d['tasks'])")
assignments=$(api GET "/api/assignments/?run=$run_id&limit=1000" \
  | field "sorted((a['round_index'], a['device'], a['task']) for a in d['results'] if a['status'] == 'succeeded')")
python3 -c "import sys; a = eval(sys.argv[1]); sys.exit(len(a) != len(set(a)) or len(a) != $rounds * $tasks)" "$assignments" \
  || die "assignments counted $assignments, expected each of $tasks tasks once per round"
trained=$(find "$work/artifacts" -name '*.safetensors' | wc -l)
foreign=$(find "$work/artifacts" ! -uid 1000 | wc -l)
[ "$trained" -gt 0 ] && [ "$foreign" = 0 ] \
  || die "the host folder holds $trained weights files and $foreign entries not owned by uid 1000"
log "run $run_id succeeded in ${run_s} s across a worker and a Redis restart: rounds $counted and" \
  "$((rounds * tasks)) assignments, each once; $trained weights files in the host folder, all uid 1000's"
wait_healthy 180

# ---- 5. the plug-in setting survives a rebuild from a shell that never set it --------------
compose build >"$work/rebuild.log" 2>&1 || { tail -40 "$work/rebuild.log" >&2; die "the rebuild failed"; }
compose up -d >/dev/null 2>&1
listed=$(compose exec -T web mtfl plugins 2>&1)
[[ $listed == *tabular_mlp* ]] || die "after a rebuild, mtfl plugins lists no custom-task plug-in: $listed"
log "after a rebuild, mtfl plugins still lists the plug-in"

# ---- 6. figures ------------------------------------------------------------------------------
size_mb() { docker image inspect -f '{{.Size}}' "$1" | awk '{printf "%.0f", $1 / 1e6}'; }
image_mb=$(size_mb "mtfl-lab-controlplane:$tag")
agent_image_mb=$(size_mb "mtfl-lab-agent:$tag")
# What only a GPU needs in the control-plane image: the NVIDIA libraries, triton, the CUDA
# bindings and torch's CUDA libraries. Where no CPU-only torch index is reachable (here), the image
# less these is an estimate of the CPU-only image's size, reported as such.
cuda_mb=$(docker run --rm --entrypoint sh "mtfl-lab-controlplane:$tag" -c '
  site=$(python -c "import site; print(site.getsitepackages()[0])")
  du -smc "$site"/nvidia "$site"/triton "$site"/cuda "$site"/torch/lib/*cuda* "$site"/torch/lib/*nvshmem* \
    "$site"/torch/lib/*nvrtc* 2>/dev/null | tail -1 | cut -f1')
status=ok
if [ -n "$json_out" ]; then
  # An entry of a benchmarks/results file: appended, so earlier runs stay on record.
  python3 - "$json_out" <<PY
import datetime, json, os, platform, sys
path = sys.argv[1]
data = json.load(open(path)) if os.path.exists(path) else {
    "benchmark": "deploy/compose_check.sh",
    "description": "The lab deployment built, started and exercised end to end on a Docker engine "
    "(docs/deployment.md, 'The end-to-end check'). Sizes in MB (10^6 bytes) as docker reports them.",
    "entries": [],
}
data["entries"].append({
    "command": "deploy/compose_check.sh --json $json_arg",
    "commit": "$(git -C "$repo" rev-parse --short HEAD 2>/dev/null || echo unknown)",
    "date": datetime.date.today().isoformat(),
    "host": f"{platform.node()} ({os.cpu_count()} CPUs)",
    "build_s": $build_s, "up_healthy_s": $up_healthy_s, "run_s": $run_s,
    "image_mb": $image_mb, "agent_image_mb": $agent_image_mb,
    "controlplane_cuda_only_mb": $cuda_mb,
    "controlplane_cpu_only_estimate_mb": $image_mb - $cuda_mb,
    "rounds": $rounds, "tasks": $tasks, "restarted_while_round_0_trained": ["worker", "redis"],
    "compose": "$($COMPOSE version --short 2>/dev/null || echo unknown)",
    "dockerd": "$(docker version -f '{{.Server.Version}}')",
    "base_images": {"python": "$python_image", "postgres": "$postgres_image", "redis": "$redis_image"},
    "controlplane_torch_index": "${controlplane_torch_index:-PyPI}",
    "cold_build": $cold_build,
})
with open(path, "w") as out:
    json.dump(data, out, indent=2)
    out.write("\n")
PY
  log "figures appended to $json_out"
fi
echo "compose_check=ok build_s=$build_s up_healthy_s=$up_healthy_s image_mb=$image_mb agent_image_mb=$agent_image_mb cuda_only_mb=$cuda_mb run_s=$run_s rounds=$rounds compose=\"$($COMPOSE version --short 2>/dev/null || echo unknown)\""
