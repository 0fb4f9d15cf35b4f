#!/bin/sh
# install_examples.sh BUILD SOURCE — `make install PREFIX=...` into a
# temporary prefix, then the examples built against that installed tree
# alone (pkg-config --cflags --libs dtrain, shared and static), run: the
# training loop, and the allreduce over 3 ranks under the installed
# `dtrain launch`. The man pages and the headers must be there too.
set -eu
BUILD=$1 SRC=$2
dir=$(mktemp -d "${TMPDIR:-/tmp}/dt_install.XXXXXX")
trap 'rm -rf "$dir"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
command -v pkg-config >/dev/null || fail "pkg-config is missing (scripts/install-deps.sh installs it)"

# What `make install PREFIX=...` runs after its build step (the build is
# ctest's own: a rebuild here would relink binaries other tests are running).
cmake --install "$BUILD" --prefix "$dir/prefix" --component dtrain > "$dir/install.log" 2>&1 ||
    { cat "$dir/install.log"; fail "cmake --install (make install)"; }
p=$dir/prefix
for f in bin/dtrain lib/libdtrain.a lib/libdtrain.so include/dtrain/comm.h include/dtrain/train.h \
         lib/pkgconfig/dtrain.pc; do
    [ -e "$p/$f" ] || fail "$f was not installed"
done
if command -v help2man >/dev/null; then
    for page in dtrain dtrain-train dtrain-launch dtrain-sample dtrain-export; do
        [ -s "$p/share/man/man1/$page.1" ] || fail "man page $page.1 was not installed"
    done
    grep -q "nproc" "$p/share/man/man1/dtrain-train.1" || fail "dtrain-train.1 lacks --nproc"
fi

# Only the installed tree: no -I or -L into the source or build folders.
export PKG_CONFIG_PATH=$p/lib/pkgconfig
cflags=$(pkg-config --cflags dtrain) libs=$(pkg-config --libs dtrain)
static=$(pkg-config --static --libs dtrain)
case "$cflags $libs" in *"$SRC"*|*"$BUILD"*) fail "pkg-config points outside the prefix: $cflags $libs" ;; esac
cd "$dir"
cc -std=c11 -Wall -Werror "$SRC/examples/train_loop.c" $cflags $libs -Wl,-rpath,"$p/lib" -o train_loop
cc -std=c11 -Wall -Werror "$SRC/examples/allreduce.c" $cflags $libs -Wl,-rpath,"$p/lib" -o allreduce
cc -std=c11 -Wall -Werror "$SRC/examples/allreduce.c" $cflags -Wl,-Bstatic -ldtrain -Wl,-Bdynamic \
    $(echo "$static" | sed 's/-ldtrain//') -o allreduce_static
ldd ./train_loop | grep -q "$p/lib/libdtrain.so" || fail "train_loop is not linked to the installed libdtrain.so"
./train_loop 40 || fail "train_loop"
"$p/bin/dtrain" launch -n 3 ./allreduce || fail "allreduce under dtrain launch"
"$p/bin/dtrain" launch -n 2 ./allreduce_static || fail "allreduce (static) under dtrain launch"
"$p/bin/dtrain" --version
echo "all passed"
