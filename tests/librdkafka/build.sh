#!/bin/sh
# Build librdkafka's own test suite (tests/test-runner) from Debian's source package of
# librdkafka, the version kcat and confluent-kafka's Debian users run (2.0.2 on bookworm).
# Debian's archive is one of the registries this project may use; the source package is
# fetched with apt into DEST and built there. Nothing of it is committed.
#
# usage: tests/librdkafka/build.sh DEST     (DEST/tests/test-runner when it succeeds)
#
# Exit 0 with the test-runner built (or already there); exit 2 when apt cannot fetch the
# source (no Debian archive here): the suite's tests then skip and say so.
set -eu
DEST=${1:?usage: build.sh DEST}
mkdir -p "$DEST"
DEST=$(cd "$DEST" && pwd)
RUNNER="$DEST/src/tests/test-runner"
# Bumped when the build changes (v2: with RapidJSON), so an older build is redone.
STAMP="$DEST/built-v2"
if [ -x "$RUNNER" ] && [ -f "$STAMP" ]; then
    echo "librdkafka test-runner already built: $RUNNER"
    exit 0
fi

# A deb-src list made from the machine's own Debian sources (deb822 or one-line form),
# kept apart from the system's apt state.
APT="$DEST/apt"
mkdir -p "$APT/lists/partial"
: > "$APT/sources.list"
if [ -f /etc/apt/sources.list.d/debian.sources ]; then
    sed 's/^Types: deb$/Types: deb-src/' /etc/apt/sources.list.d/debian.sources \
        > "$APT/debian-src.sources"
fi
if [ -f /etc/apt/sources.list ]; then
    grep -E '^deb ' /etc/apt/sources.list | sed 's/^deb /deb-src /' > "$APT/sources.list" || true
fi
apt_opts="-o Dir::Etc::SourceList=$APT/sources.list -o Dir::Etc::SourceParts=$APT \
  -o Dir::State::Lists=$APT/lists -o APT::Sandbox::User=root"
# shellcheck disable=SC2086
if ! apt-get $apt_opts update -q >"$DEST/apt-update.log" 2>&1; then
    echo "librdkafka suite: apt-get update of deb-src failed (see $DEST/apt-update.log)" >&2
    exit 2
fi
cd "$DEST"
# shellcheck disable=SC2086
if ! apt-get $apt_opts source --download-only librdkafka >"$DEST/apt-source.log" 2>&1; then
    echo "librdkafka suite: apt-get source librdkafka failed (see $DEST/apt-source.log)" >&2
    exit 2
fi
rm -rf "$DEST/src" && mkdir -p "$DEST/src"
tar -xzf "$DEST"/librdkafka_*.orig.tar.gz -C "$DEST/src" --strip-components=1

# The build needs Debian's compilers, the libraries librdkafka links, and RapidJSON
# (the tests that check the statistics JSON, 0053 and 0110, need it).
need=""
for pkg in build-essential zlib1g-dev libzstd-dev liblz4-dev libssl-dev libsasl2-dev \
           rapidjson-dev; do
    dpkg -s "$pkg" >/dev/null 2>&1 || need="$need $pkg"
done
if [ -n "$need" ]; then
    # shellcheck disable=SC2086
    apt-get install -y -q $need >"$DEST/apt-install.log" 2>&1 || {
        apt-get update -q >/dev/null 2>&1
        # shellcheck disable=SC2086
        apt-get install -y -q $need >"$DEST/apt-install.log" 2>&1
    }
fi

cd "$DEST/src"
./configure >"$DEST/configure.log" 2>&1
make -j2 libs >"$DEST/make-libs.log" 2>&1
make -C tests -j2 build >"$DEST/make-tests.log" 2>&1
test -x "$RUNNER"
touch "$STAMP"
echo "librdkafka test-runner built: $RUNNER"
