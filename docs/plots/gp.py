"""gp.py: what timeline.py and step_comm.py share to draw with gnuplot: a
string as gnuplot reads it, whatever it holds (a title with a quote broke
the script), and a PNG written whole or not at all (a failed draw left a
file of 0 bytes where the figure was)."""
import os
import subprocess


def gp_string(s):
    """s as a gnuplot string: single quotes take no escapes, a quote inside is doubled."""
    return "'" + str(s).replace("'", "''") + "'"


def draw_png(terminal, body, out, script_path):
    """Writes the script (terminal, the output, body) to script_path and runs
    gnuplot, drawing into OUT.tmp, renamed to OUT once gnuplot succeeded.
    Returns None, or what failed."""
    tmp = out + ".tmp"
    with open(script_path, "w") as f:
        f.write(f"{terminal}\nset output {gp_string(tmp)}\n{body}\n")
    try:
        rc = subprocess.call(["gnuplot", script_path])
        if rc == 0 and os.path.isfile(tmp) and os.path.getsize(tmp) > 0:
            os.replace(tmp, out)
            return None
        return f"gnuplot failed ({rc}) drawing '{out}'"
    except OSError as e:
        return f"cannot draw '{out}': {e}"
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
