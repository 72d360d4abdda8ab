#!/bin/sh
# ironserve lab stand-in: a writable cpufreq tree inside a lab host.
# The real /sys is read-only in the container and this VM may have no cpufreq at all.
# An overlay whose lower layer is the container's own view of /sys/devices/system/cpu and
# whose upper layer is a tmpfs keeps the real topology files, adds cpuN/cpufreq/, and can
# never write to the real sysfs (overlayfs never writes a lower layer). It runs inside the
# container because nspawn mounts /sys after its --bind mounts when a netns is used.
set -e
base=/sys/devices/system/cpu
grep -q " $base overlay " /proc/mounts && exit 0
mkdir -p /run/ironlab/cpu-upper /run/ironlab/cpu-work
mount -t overlay -o "lowerdir=$base,upperdir=/run/ironlab/cpu-upper,workdir=/run/ironlab/cpu-work" ironlab-cpufreq "$base"
for cpu in "$base"/cpu[0-9]*; do
    d="$cpu/cpufreq"
    mkdir -p "$d"
    echo powersave > "$d/scaling_governor"
    echo "performance powersave" > "$d/scaling_available_governors"
    echo intel_pstate > "$d/scaling_driver"
    echo 800000 > "$d/cpuinfo_min_freq"
    echo 3800000 > "$d/cpuinfo_max_freq"
    echo 800000 > "$d/scaling_min_freq"
    echo 3800000 > "$d/scaling_max_freq"
    echo 2000000 > "$d/scaling_cur_freq"
done
