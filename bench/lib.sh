# bench/lib.sh — helpers the benchmark scripts share; sourced from the repository root
# (`. bench/lib.sh` after the script's `cd "$(dirname "$0")/.."`).

# med: the median of the numbers on standard input (separated by spaces or newlines; the mean of
# the middle two for an even count). `sort -g` reads 1e+06 and 1.5 alike.
med() { tr ' ' '\n' | grep . | sort -g | awk '{a[NR]=$1} END {print (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2)}'; }

# free_port: a TCP port on 127.0.0.1 that nothing listens on now (the kernel's choice).
free_port() { "${PY:-/usr/bin/python3}" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

# ddptrain_rate BUILD NPROC CONFIG STEPS OUT_DIR: ddptrain's median samples/s over the 50-step
# progress windows after the first and before the last (NPROC ranks on this host, no data
# threads, no evaluation or checkpoint on the way).
ddptrain_rate() {
    "$1/bin/ddprun" --standalone --nproc_per_node="$2" --no_prefix "$1/bin/ddptrain" \
        --config "$3" --total_steps "$4" --log_every 50 --eval_every 100000 --checkpoint.every 0 \
        --data.threads 0 --overwrite true --out_dir "$5" 2>/dev/null |
        sed -n 's/^step \([0-9]*\)\/.* | \([0-9]*\) samples\/s.*/\1 \2/p' |
        awk -v last="$4" '$1 > 50 && $1 < last {print $2}' | tr '\n' ' ' | med
}

# turn_order I: the order two builds A and B take in repetition I — "A B", then "B A", so that a
# drift in the host favours neither.
turn_order() { if (($1 % 2)); then echo "B A"; else echo "A B"; fi; }

# hog_on / hog_off: a CPU hog (yes) beside the measured runs, the "busy host" case; HOG its pid
hog_on() {
    yes >/dev/null &
    HOG=$!
}
hog_off() {
    kill "$HOG" 2>/dev/null
    wait "$HOG" 2>/dev/null || true
    HOG=
}
