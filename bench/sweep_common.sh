# What the GPU sweeps (bench/*_sweep.sh) share, sourced after they set LOG: the CUDA libraries on
# the library path (kept in py_ld as the caller had it, for torch) and step(), one bounded command
# with its output in $LOG/<name>.txt.
py_ld=${LD_LIBRARY_PATH:-}
libdirs=$(find /opt /usr /root /home -name 'libcublas.so.13' -o -name 'libnccl.so.2' 2>/dev/null |
          xargs -r -n1 dirname | sort -u | paste -sd: -)
export LD_LIBRARY_PATH=${libdirs}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
mkdir -p "$LOG"
step() {  # name, seconds, command...
  local name=$1 limit=$2; shift 2
  timeout "$limit" "$@" >"$LOG/$name.txt" 2>&1
  echo "$name rc=$?"
}
