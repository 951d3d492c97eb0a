#!/usr/bin/env bash
# Make the "docker" sandbox usable: start a Docker engine if none answers,
# then build the sandbox image if it is missing or from an older recipe.
#
# Idempotent: a second run does nothing when the engine answers and the
# image is current. It exits 0 with a message when the engine or the image
# cannot be had here (no root, no package, no kernel support, no mirror),
# so CI carries on and tests/test_sandbox_docker.py skips with a reason.
#
# Nothing is pulled from a container registry: the image is a Debian
# bookworm minbase root filesystem with python3, made by debootstrap from
# a Debian mirror and loaded with `docker import`.
#
# Environment:
#   AGENTGYM_DEBIAN_MIRROR  Debian mirror for debootstrap (default deb.debian.org)
#   AGENTGYM_DOCKERD_LOG    where a dockerd started here logs
set -uo pipefail

# Keep IMAGE in step with agentgym.sandboxes.docker.IMAGE (a test checks it).
IMAGE="agentgym-sandbox:py311"
# Bump when the recipe below changes, so existing images are rebuilt.
RECIPE_VERSION="2"
MIRROR="${AGENTGYM_DEBIAN_MIRROR:-http://deb.debian.org/debian}"
DOCKERD_LOG="${AGENTGYM_DOCKERD_LOG:-/var/log/agentgym-dockerd.log}"

say() { echo "docker_setup: $*"; }
give_up() {
    say "$*"
    # One line that stands out in CI's log: the docker attack tests will not run.
    echo "docker_setup: UNAVAILABLE: the docker sandbox; tests/test_sandbox_docker.py will be" \
        "SKIPPED (pytest -rs lists the reason)" | tee /dev/stderr >/dev/null
    exit 0
}

as_root() {
    if [ "$(id -u)" -eq 0 ]; then "$@"; elif command -v sudo >/dev/null; then sudo -n "$@"; else
        return 1
    fi
}

engine_answers() { docker info >/dev/null 2>&1; }

apt_install() {
    command -v apt-get >/dev/null || return 1
    DEBIAN_FRONTEND=noninteractive as_root apt-get install -y --no-install-recommends "$@" \
        >/dev/null 2>&1 && return 0
    # The package lists may be missing on a fresh machine.
    as_root apt-get update >/dev/null 2>&1 &&
        DEBIAN_FRONTEND=noninteractive as_root apt-get install -y --no-install-recommends "$@" \
            >/dev/null 2>&1
}

start_engine() {
    engine_answers && return 0
    if ! command -v dockerd >/dev/null; then
        say "no dockerd; installing docker.io"
        apt_install docker.io || give_up "could not install docker.io (needs root and apt)."
    fi
    command -v docker >/dev/null || give_up "no docker CLI on PATH."
    local ours=""
    if ! pgrep -x dockerd >/dev/null; then
        say "starting dockerd (log: $DOCKERD_LOG)"
        # No iptables and no bridge: sandbox containers run with network "none",
        # and a VM or CI runner often lacks the netfilter modules.
        as_root sh -c "nohup dockerd --iptables=false --ip6tables=false --bridge=none \
            >>'$DOCKERD_LOG' 2>&1 &" || give_up "could not start dockerd (needs root)."
        ours=1
    fi
    for _ in $(seq 60); do
        engine_answers && return 0
        sleep 0.5
    done
    [ -n "$ours" ] || give_up "a dockerd runs but does not answer this user (socket permissions?)."
    tail -n 20 "$DOCKERD_LOG" 2>/dev/null
    give_up "dockerd did not answer within 30 s (log above: $DOCKERD_LOG)."
}

image_current() {
    local version
    version=$(docker image inspect -f '{{index .Config.Labels "org.agentgym.recipe"}}' \
        "$IMAGE" 2>/dev/null) || return 1
    [ "$version" = "$RECIPE_VERSION" ]
}

build_image() {
    image_current && {
        say "image $IMAGE is current"
        return 0
    }
    command -v debootstrap >/dev/null || apt_install debootstrap ||
        give_up "could not install debootstrap."
    local started old
    old=$(docker image inspect -f '{{.Id}}' "$IMAGE" 2>/dev/null)
    # Global, not local: the EXIT trap runs after this function has returned.
    rootfs=$(mktemp -d /var/tmp/agentgym-rootfs.XXXXXX) || give_up "no temporary directory."
    trap 'as_root rm -rf "$rootfs"' EXIT
    started=$(date +%s)
    say "building $IMAGE from $MIRROR (about a minute)"
    # python3 (not python3-minimal): model code expects json, heapq, fractions, ...
    if ! as_root debootstrap --variant=minbase --include=python3 bookworm "$rootfs" "$MIRROR" \
        >"$rootfs.log" 2>&1; then
        tail -n 20 "$rootfs.log"
        give_up "debootstrap failed (log above: $rootfs.log)."
    fi
    # Package caches, docs and locales are no use inside a sandbox.
    as_root rm -rf "$rootfs"/var/cache/apt/* "$rootfs"/var/lib/apt/lists/* \
        "$rootfs"/usr/share/doc/* "$rootfs"/usr/share/man/* "$rootfs"/usr/share/info/* \
        "$rootfs"/usr/share/locale/*
    # Docker gives a tmpfs mount the mode of the directory under it, and the
    # sandbox user (65534) must be able to write the work dir.
    as_root install -d -m 1777 "$rootfs/work"
    as_root tar --numeric-owner -C "$rootfs" -c . |
        docker import \
            --change 'LABEL org.agentgym.recipe='"$RECIPE_VERSION" \
            --change 'ENV PATH=/usr/local/bin:/usr/bin:/bin LANG=C.UTF-8' \
            --change 'WORKDIR /work' \
            --change 'USER 65534:65534' \
            --change 'CMD ["python3"]' \
            - "$IMAGE" >/dev/null || give_up "docker import failed."
    rm -f "$rootfs.log"
    # The image from an older recipe lost its tag; do not leave it dangling.
    [ -n "$old" ] && docker image rm "$old" >/dev/null 2>&1
    say "built $IMAGE in $(($(date +%s) - started)) s ($(docker image inspect -f '{{.Size}}' "$IMAGE") bytes)"
}

start_engine
build_image
