"""The engines: static (source -> the rules whose prefilter matches -> findings with their fixes) and runtime
(a profile's op graph or a trace -> the runtime detectors -> detections). Commands only parse and render."""
