"""One CSV line at a time."""


def parse_line(line, sep=","):
    """Split one CSV line into fields; quoted fields may contain the separator."""
    fields = []
    buf = []
    in_quotes = False
    i = 0
    while i < len(line):
        ch = line[i]
        if in_quotes:
            if ch == '"':
                in_quotes = False
            else:
                buf.append(ch)
        elif ch == '"':
            in_quotes = True
        elif ch == sep:
            fields.append("".join(buf))
            buf = []
        else:
            buf.append(ch)
        i += 1
    if in_quotes:
        raise ValueError("unterminated quoted field in %r" % line)
    fields.append("".join(buf))
    return fields


def format_line(fields, sep=","):
    """Join fields into one CSV line, quoting those that need it."""
    out = []
    for field in fields:
        text = str(field)
        if sep in text or '"' in text or "\n" in text:
            text = '"' + text.replace('"', '""') + '"'
        out.append(text)
    return sep.join(out)
