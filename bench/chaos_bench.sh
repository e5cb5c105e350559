#!/usr/bin/env bash
# ddpbench under faults: SIGKILL of a random rank at a random moment (seeded), checking exit code,
# blame, leftover processes and /dev/shm segments. Usage: chaos_bench.sh BINDIR TRIALS SEED [BACKEND] [WORLD]
B=$1; N=$2; SEED=$3; BE=${4:-shm}; W=${5:-3}
RANDOM=$SEED; bad=0
for i in $(seq $N); do
  tag=bch$SEED-$BE-$i
  CHAOS_TAG=$tag setsid $B/ddprun --standalone --nproc_per_node $W --grace_period 2 --run_id $tag $B/ddpbench --op all --min 4 --max 16M --backend $BE >${CHAOS_DIR:-/tmp}/$tag.out 2>${CHAOS_DIR:-/tmp}/$tag.err &
  P=$!
  d=$(( RANDOM % 3000 )); sleep $(printf "0.%03d" $d); [ $d -ge 1000 ] && sleep 1
  r=$(( RANDOM % W ))
  wp=$(for p in $(pgrep -P $P); do grep -qz "^RANK=$r\$" /proc/$p/environ 2>/dev/null && echo $p; done)
  t0=$(date +%s%N); kill -9 $wp 2>/dev/null
  timeout 20 tail --pid=$P -f /dev/null; wait $P; rc=$?; t1=$(date +%s%N)
  sleep 0.5
  left=$(grep -lz "^CHAOS_TAG=$tag\$" /proc/[0-9]*/environ 2>/dev/null | wc -l)
  segs=$(ls /dev/shm | grep -c "ddp-$tag")
  blame=$(grep -o "worker failed: rank [0-9]*" ${CHAOS_DIR:-/tmp}/$tag.err | tail -1)
  ms=$(( (t1 - t0) / 1000000 ))
  st=ok; [ "$rc" = 1 ] && [ "$blame" = "worker failed: rank $r" ] && [ $left = 0 ] && [ $segs = 0 ] || st=BAD
  [ $rc = 0 ] && [ -z "$wp" ] && st="ok(ended)"
  [ $st = BAD ] && bad=$((bad+1))
  echo "$st $tag delay ${d}ms rank $r pid $wp rc $rc end ${ms}ms blame '$blame' left $left segs $segs"
  [ $st = BAD ] || rm -f ${CHAOS_DIR:-/tmp}/$tag.out ${CHAOS_DIR:-/tmp}/$tag.err
done
echo "ddpbench $BE world $W: $N trials, $bad bad (seed $SEED)"
