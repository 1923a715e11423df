"""The columns of packet rows (one row per TrackEvent a batch writes), stored as int64[NCOLS, N]:
``rows[C_TS]`` is a contiguous column, so each is filled and read in one pass."""

(C_TRACK, C_TS, C_K1, C_K2, C_K3, C_G, C_PRE, C_FLOW, C_SID, C_SPANANN, C_PARENT, C_EXTRA,
 C_RAW, C_RAWS, C_RAWE, C_RAWEND) = range(16)
NCOLS = 16
FLOW_OUT, FLOW_IN = 1, 2
K2_END, K2_COUNTER = 1, 2  # BEGIN rows: 0
