# bench/lib.sh — helpers the benchmark scripts share; sourced from the repository root
# (`. bench/lib.sh` after the script's `cd "$(dirname "$0")/.."`).

# med: the median of the numbers on standard input (separated by spaces or newlines; the mean of
# the middle two for an even count). `sort -g` reads 1e+06 and 1.5 alike.
med() { tr ' ' '\n' | grep . | sort -g | awk '{a[NR]=$1} END {print (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2)}'; }

# free_port: a TCP port on 127.0.0.1 that nothing listens on now (the kernel's choice).
free_port() { "${PY:-/usr/bin/python3}" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
