#!/usr/bin/env bash
# Installs what the conformance client programs need (see README.md), on a
# Debian machine of the project's kind. Idempotent and quick when everything
# is already there: each step checks before it installs. Safe to run again.
#
#   Debian:  a JDK (javac) and Maven for the Java client and the Kafka jars,
#            python3-venv, python3-confluent-kafka (librdkafka 2.0.2, the
#            "old librdkafka" row of the matrix)
#   PyPI:    confluent-kafka (python/requirements.txt) in a venv at
#            $FERRY_CACHE/clients/py-venv, else <repo>/.cache/clients/py-venv
#   PyPI:    kafka-python with its codecs (kafka-python/requirements.txt) in a
#            venv of its own at <cache>/clients/kafka-python-venv
#   Go:      the confluent-kafka-go client (confluent-kafka-go/, a module of its
#            own; cgo, so gcc) built with the Go module proxy into
#            <cache>/clients/confluent-kafka-go-<hash of its sources>/client
#   npm:     kafkajs and kafkajs-snappy, `npm ci` into node/node_modules
#   Debian:  prometheus, for promtool (deploy/deploy_test.go checks and unit
#            tests deploy/prometheus/ferry-alerts.yml with it); its server is
#            not started
#   Debian:  chromium, headless, for admin/ui_test.go (the status page)
#   Debian:  buildah, for deploy/container_test.go (builds the Dockerfile,
#            chroot isolation: no container engine or registry needed)
#   PyPI:    kubernetes-validate (deploy/kubernetes/requirements.txt) in a venv
#            at $FERRY_CACHE/deploy/k8s-venv, for deploy/kubernetes_test.go
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
cache=${FERRY_CACHE:-$root/.cache}
venv=$cache/clients/py-venv
say() { echo "install.sh: $*" >&2; }

# sudo runs what needs root: directly as root, else through sudo.
sudo=()
[[ $(id -u) == 0 ]] || sudo=(sudo)

# apt_install installs Debian packages, with the package lists updated first.
apt_install() {
	"${sudo[@]}" apt-get update -q
	DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -q --no-install-recommends "$@"
}

# --- Debian packages ---------------------------------------------------------
apt_pkgs=()
command -v javac >/dev/null 2>&1 || apt_pkgs+=(openjdk-17-jdk-headless)
command -v mvn >/dev/null 2>&1 || apt_pkgs+=(maven)
command -v node >/dev/null 2>&1 || apt_pkgs+=(nodejs)
command -v npm >/dev/null 2>&1 || apt_pkgs+=(npm)
command -v gcc >/dev/null 2>&1 || apt_pkgs+=(gcc libc6-dev)
/usr/bin/python3 -c 'import ensurepip, venv' >/dev/null 2>&1 || apt_pkgs+=(python3-venv)
/usr/bin/python3 -c 'import confluent_kafka' >/dev/null 2>&1 || apt_pkgs+=(python3-confluent-kafka)
if ((${#apt_pkgs[@]})); then
	say "apt-get install ${apt_pkgs[*]}"
	apt_install "${apt_pkgs[@]}"
fi

# --- promtool (Debian's prometheus package) -----------------------------------
# Installing the package must not start a Prometheus server: when no
# policy-rc.d says so already (Docker images have one), one denying every
# service start is in place for the install only.
if ! command -v promtool >/dev/null 2>&1; then
	say "apt-get install prometheus (for promtool; the server is not started)"
	policy=/usr/sbin/policy-rc.d
	if [[ ! -e $policy ]]; then
		printf '#!/bin/sh\n# ferry install.sh: no service starts while installing prometheus\nexit 101\n' | "${sudo[@]}" tee "$policy" >/dev/null
		"${sudo[@]}" chmod 755 "$policy"
		trap '"${sudo[@]}" rm -f "$policy"' EXIT
	fi
	((${#apt_pkgs[@]})) || "${sudo[@]}" apt-get update -q
	DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -q --no-install-recommends prometheus
	if [[ $(trap -p EXIT) ]]; then
		"${sudo[@]}" rm -f "$policy"
		trap - EXIT
	fi
fi

# --- chromium (Debian's, for the status page's test) ---------------------------
# admin/ui_test.go loads the admin status page in headless Chromium; with
# CI=true it fails when chromium is missing.
if ! command -v chromium >/dev/null 2>&1; then
	say "apt-get install chromium (headless, for admin/ui_test.go)"
	apt_install chromium
fi

# --- buildah (Debian's, for the container image's test) -------------------------
# deploy/container_test.go builds the Dockerfile with it; with CI=true it
# fails when buildah is missing.
if ! command -v buildah >/dev/null 2>&1; then
	say "apt-get install buildah (for deploy/container_test.go)"
	apt_install buildah
fi

# --- PyPI venvs --------------------------------------------------------------------
# venv DIR REQUIREMENTS CHECK makes a venv at DIR with REQUIREMENTS installed,
# unless one is there already that was built from the same requirements (a
# stamp file holds them; a change rebuilds it) and passes CHECK, a Python
# line run in it.
venv() {
	local dir=$1 req=$2 check=$3 want
	want=$(cat "$req")
	if [[ -x $dir/bin/python && "$(cat "$dir/.ferry-requirements" 2>/dev/null)" == "$want" ]] &&
		"$dir/bin/python" -c "$check" >/dev/null 2>&1; then
		return
	fi
	say "creating $dir"
	mkdir -p "$(dirname "$dir")"
	/usr/bin/python3 -m venv --clear "$dir"
	"$dir/bin/pip" install -q --disable-pip-version-check --no-input -r "$req"
	printf '%s' "$want" >"$dir/.ferry-requirements"
}

# kubernetes-validate: the Kubernetes JSON schemas ship inside the package, so
# validating the rendered manifests needs no network.
k8s_venv=$cache/deploy/k8s-venv
venv "$k8s_venv" "$root/deploy/kubernetes/requirements.txt" 'import kubernetes_validate'
# confluent-kafka (the PyPI wheel, its librdkafka bundled).
venv "$venv" "$here/python/requirements.txt" 'import confluent_kafka'
# kafka-python, in a venv of its own, and its codecs (python-snappy, lz4,
# zstandard; crc32c for the record checksums).
kp_venv=$cache/clients/kafka-python-venv
venv "$kp_venv" "$here/kafka-python/requirements.txt" 'import kafka, snappy, lz4.frame, zstandard, crc32c'

# --- Go confluent-kafka-go ------------------------------------------------------------
# Built once per version of its sources (the hash of go.mod, go.sum and the
# .go files, as conformance/matrix_clients_test.go computes it): the tests
# look for this very binary, so one built from older sources is not run.
ckgo_src=$here/confluent-kafka-go
ckgo_hash=$(cat "$ckgo_src/go.mod" "$ckgo_src/go.sum" "$ckgo_src"/*.go | sha256sum | cut -c1-12)
ckgo_bin=$cache/clients/confluent-kafka-go-$ckgo_hash/client
if [[ ! -x $ckgo_bin ]]; then
	say "go build $ckgo_bin"
	mkdir -p "$(dirname "$ckgo_bin")"
	(cd "$ckgo_src" && GOWORK=off GOFLAGS=-mod=readonly CGO_ENABLED=1 go build -o "$ckgo_bin.tmp" .)
	mv "$ckgo_bin.tmp" "$ckgo_bin"
fi

# --- npm kafkajs -------------------------------------------------------------------
lock=$(sha256sum "$here/node/package-lock.json" | cut -d' ' -f1)
if [[ "$(cat "$here/node/node_modules/.ferry-lock" 2>/dev/null)" != "$lock" ]]; then
	say "npm ci in $here/node"
	(cd "$here/node" && npm ci --no-audit --no-fund --loglevel=error) >&2
	printf '%s' "$lock" >"$here/node/node_modules/.ferry-lock"
fi

say "ok: java $(javac -version 2>&1 | cut -d' ' -f2), $("$venv/bin/python" -c 'import confluent_kafka as c; print("confluent-kafka", c.version()[0] if isinstance(c.version(), tuple) else c.version(), "librdkafka", c.libversion()[0])'), debian $(/usr/bin/python3 -c 'import confluent_kafka as c; print("librdkafka", c.libversion()[0])'), kafka-python $("$kp_venv/bin/python" -c 'import kafka; print(kafka.__version__)'), confluent-kafka-go $("$ckgo_bin" version), node $(node --version) kafkajs $(node -p 'require(process.argv[1]).version' "$here/node/node_modules/kafkajs/package.json"), $(promtool --version 2>&1 | head -1 | cut -d' ' -f1-3), $(buildah --version), kubernetes-validate $("$k8s_venv/bin/kubernetes-validate" --version 2>&1 | tail -1)"
