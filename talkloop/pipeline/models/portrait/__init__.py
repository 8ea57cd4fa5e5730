"""The portrait family: a real person from one photo, animated by warping the photo.

Init: face detection, dense landmarks and a head-and-shoulders framing (``framing.py``,
``face.py``). Per chunk: a flow-matching DiT over per-frame motion parameters (``motion.py``).
Publish: a renderer that warps the photo along its landmark mesh and paints the mouth interior
(``render.py``). ``family.py`` builds the modules and stages.
"""
