# build.sh REV NAME: compile REV's kernels into /tmp/ab/NAME.so
set -e
d=/tmp/ab/src-$2; rm -rf $d; mkdir -p $d
cd $(git rev-parse --show-toplevel)
if [ "$1" = WORK ]; then cp dspark/runtime/kernels/* $d/; else for f in $(git ls-tree --name-only $1 dspark/runtime/kernels/); do git show $1:$f > $d/$(basename $f); done; fi
cc -O3 -mavx2 -mfma -ffp-contract=off -fopenmp -shared -fPIC -o /tmp/ab/$2.so $d/*.c
