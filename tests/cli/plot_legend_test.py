"""The timeline's legend draws what the plot draws: communication swatches in a scheme's
colour (the bands are the scheme's colour, pale where hidden), and two different glyphs
for a micro-batch boundary and the step's end. Skipped (exit 77) without matplotlib."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(sys.argv[1]) / "tools"))
try:
    import matplotlib
except ImportError:
    sys.exit(77)
matplotlib.use("Agg")
import plot  # noqa: E402  (tools/plot.py)
from matplotlib.colors import to_hex  # noqa: E402

handles = plot.timeline_legend_handles({"linear", "ring inter-node", "gradient sync"},
                                       {"ring inter-node", "gradient sync"}, 3)
by_label = {h.get_label(): h for h in handles}
hidden = next(h for label, h in by_label.items() if label.startswith("communication (thin band"))
exposed = by_label["communication, exposed"]
ring = plot.CATEGORY_COLOURS["ring inter-node"]
assert to_hex(hidden.get_facecolor()) == ring, (to_hex(hidden.get_facecolor()), ring)
assert to_hex(exposed.get_facecolor()) == ring, (to_hex(exposed.get_facecolor()), ring)
assert hidden.get_alpha() < 1 and exposed.get_alpha() in (None, 1)
boundary, end = by_label["micro-batch boundary"], by_label["step end"]
glyph = lambda line: (line.get_linestyle(), line.get_linewidth(), to_hex(line.get_color()))
assert glyph(boundary) != glyph(end), (glyph(boundary), glyph(end))
assert boundary.get_linestyle() != end.get_linestyle(), (boundary.get_linestyle(), end.get_linestyle())
print("plot legend: communication in the scheme's colour, boundary and step end apart")
