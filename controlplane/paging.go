package controlplane

// pageLimit is a list call's row limit: def for 0, at most most; a
// negative one is refused, naming its field.
func pageLimit(field string, n, def, most int32) (int32, error) {
	switch {
	case n < 0:
		return 0, invalidf("%s: must not be negative", field)
	case n == 0:
		return def, nil
	}
	return min(n, most), nil
}
