#!/bin/sh
# ship_segment.sh DEST SEGMENT: copies one closed segment, then its sidecar,
# to DEST/HOST/BOOT/SESSION/ with rclone (DEST is any rclone destination:
# remote:bucket/prefix, or a local directory).
#
#   recorder --config CFG -o /var/trace/ --rotate-period 10m \
#            --on-segment-closed 'scripts/ship_segment.sh store:fleet'
#
# The recorder appends the segment's path and sets RECORDER_SEGMENT_SIDECAR;
# run by hand (to resume shipping), the sidecar is taken as SEGMENT.json.
# Safe to run again on the same segment: rclone skips a copy already there
# with the same size and checksum. The sidecar goes last, so a sidecar in the
# store means its segment arrived whole. Exit 0 only when both are there.
set -eu
[ $# -eq 2 ] || { echo "usage: $0 DEST SEGMENT" >&2; exit 2; }
dest=${1%/}
segment=$2
sidecar=${RECORDER_SEGMENT_SIDECAR:-$segment.json}
# HOST/BOOT/SESSION/FILE from the sidecar; fails (and so ships nothing) when
# the segment is gone or differs from its sidecar.
rel=$("${RECORDER:-recorder}" -q index --format '{store_path}' "$segment")
rclone copyto --checksum "$segment" "$dest/$rel"
rclone copyto --checksum "$sidecar" "$dest/$rel.json"
