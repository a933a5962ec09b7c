"""video_ref.py — the video reader of the tools/ref generators (gen_video, gen_e2e, gen_internvl_video,
gen_internvl_video_train): transformers' read_video_pyav, except that a container without a frame count
in its header (Matroska, WebM, GIF: PyAV's stream.frames is 0, on which read_video_pyav divides by zero)
gets the count by demuxing every packet, as torchcodec (transformers' default decoder) does."""
import av
import numpy as np
from transformers.video_utils import VideoMetadata


def read_pyav(path, sample_indices_fn):
    """The frames sample_indices_fn(metadata=...) picks, decoded to rgb24: (array [n, h, w, 3] uint8,
    VideoMetadata with frames_indices set to the picked indices)."""
    c = av.open(path)
    st = c.streams.video[0]
    total = st.frames or sum(1 for p in c.demux(st) if p.size)
    c.seek(0)
    meta = VideoMetadata(total_num_frames=int(total), fps=float(st.average_rate),
                         duration=float(total / st.average_rate), video_backend="pyav", height=st.height,
                         width=st.width)
    indices = sample_indices_fn(metadata=meta)
    frames = []
    for i, f in enumerate(c.decode(video=0)):
        if i > indices[-1]:
            break
        if i in indices:
            frames.append(f)
    c.close()
    meta.frames_indices = indices
    return np.stack([x.to_ndarray(format="rgb24") for x in frames]), meta
