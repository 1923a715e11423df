"""The columns of a packet row (one int64 row per TrackEvent a batch writes)."""

(C_TRACK, C_TS, C_K1, C_K2, C_K3, C_G, C_PRE, C_FLOW, C_SID, C_SPANANN, C_PARENT, C_EXTRA,
 C_RAW, C_RAWS, C_RAWE, C_RAWEND) = range(16)
NCOLS = 16
FLOW_OUT, FLOW_IN = 1, 2
K2_END, K2_COUNTER = 1, 2  # BEGIN rows: 0
