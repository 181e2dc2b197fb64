#!/bin/sh
# ship_segment.sh DEST SEGMENT: copies one closed segment, then its sidecar,
# to DEST/HOST/BOOT/SESSION/ with rclone (DEST is any rclone destination:
# remote:bucket/prefix, or a local directory).
#
#   recorder --config CFG -o /var/trace/ --rotate-period 10m --max-disk 4G \
#            --on-segment-closed 'scripts/ship_segment.sh store:fleet'
#
# The recorder appends a link to the segment (checked to be the file it
# wrote, and kept for as long as this runs) and sets RECORDER_SEGMENT_SIDECAR
# to the sidecar's; run by hand (to resume shipping), the sidecar is
# SEGMENT.json. Running it
# again on a segment uploads the same bytes to the same names. The sidecar
# goes last, so a sidecar in the store means its segment arrived whole.
# Exit 0 only when both are there; 1 when the segment is gone or differs
# from its sidecar: nothing is shipped.
set -eu
[ $# -eq 2 ] || { echo "usage: $0 DEST SEGMENT" >&2; exit 2; }
dest=${1%/}
segment=$2
sidecar=${RECORDER_SEGMENT_SIDECAR:-$segment.json}
# HOST/BOOT/SESSION/FILE from the sidecar, once the segment matches it.
rel=$("${RECORDER:-recorder}" -q index --format '{store_path}' "$segment")
# Open both now: run by hand, the budget may delete them from here on; the
# data stays readable through these descriptors until the copies are done.
exec 3<"$segment" 4<"$sidecar"
rclone rcat "$dest/$rel" <&3
rclone rcat "$dest/$rel.json" <&4
