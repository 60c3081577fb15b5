package tenancy

import (
	"regexp"
	"strings"
)

// RouteClass is routes.py's RouteClass.
type RouteClass string

const (
	Salted   RouteClass = "salted"
	ReadOnly RouteClass = "read_only"
	Front    RouteClass = "front"
	Refused  RouteClass = "refused"
)

// Route is routes.py's Route, as far as the salt needs it.
type Route struct {
	Path          string
	Methods       string // comma-separated
	Kind          RouteClass
	ReachesKV     bool
	SaltField     bool
	templateParts []string
}

var (
	queryRE = regexp.MustCompile(`^(?:[A-Za-z0-9_~.!$&'()*+,;=:@/?-]|%[0-9A-Fa-f]{2})*$`)
	exact   = map[string]*Route{}
	templ   []*Route
	// belowMount is routes.py's _BELOW_MOUNT.
	belowMount = &Route{Path: "/metrics/*", Methods: "GET", Kind: Refused}
)

func init() {
	for i := range routeTable {
		r := &routeTable[i]
		if strings.Contains(r.Path, "{") {
			r.templateParts = strings.Split(r.Path, "/")
			templ = append(templ, r)
		} else {
			exact[r.Path] = r
		}
	}
}

func badTarget(raw, why string) *Refusal {
	if len(raw) > 120 {
		raw = raw[:117] + "..."
	}
	return refuse(400, CodeInvalidRequestTarget, "the request target %q is not canonical: %s", raw, why)
}

func isASCII(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] >= 0x80 {
			return false
		}
	}
	return true
}

// plainPath is the pattern `^(?:/|(?:/[A-Za-z0-9_~.-]+)+)$` (routes.py's path check)
// without a regexp on every request's path: "/", or segments of those bytes, none empty.
func plainPath(path string) bool {
	if path == "/" {
		return true
	}
	if len(path) < 2 || path[0] != '/' || path[len(path)-1] == '/' {
		return false
	}
	for i := 1; i < len(path); i++ {
		switch c := path[i]; {
		case c == '/':
			if path[i-1] == '/' {
				return false
			}
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9',
			c == '_', c == '~', c == '.', c == '-':
		default:
			return false
		}
	}
	return true
}

// dotSegment says whether path has a "." or ".." segment.
func dotSegment(path string) bool {
	for rest := path; ; {
		seg, more, found := strings.Cut(rest, "/")
		if seg == "." || seg == ".." {
			return true
		}
		if !found {
			return false
		}
		rest = more
	}
}

// CanonicalPath is routes.py's canonical_target, returning the path.
func CanonicalPath(raw string) (string, *Refusal) {
	if !strings.HasPrefix(raw, "/") {
		return "", badTarget(raw, "only origin-form targets (starting with '/') are accepted")
	}
	if !isASCII(raw) {
		return "", badTarget(raw, "it contains non-ASCII characters")
	}
	if strings.Contains(raw, "#") {
		return "", badTarget(raw, "it contains a fragment ('#')")
	}
	path, query, hasQuery := strings.Cut(raw, "?")
	if strings.Contains(path, "%") {
		return "", badTarget(raw, "the path contains percent-encoding")
	}
	if !plainPath(path) {
		return "", badTarget(raw, "the path is not a plain path of A-Z a-z 0-9 - . _ ~ segments")
	}
	if dotSegment(path) {
		return "", badTarget(raw, "the path contains a '.' or '..' segment")
	}
	if hasQuery && !queryRE.MatchString(query) {
		return "", badTarget(raw, "the query contains characters that must be percent-encoded")
	}
	return path, nil
}

// FindRoute is routes.py's find_route.
func FindRoute(path string) *Route {
	if r, ok := exact[path]; ok {
		return r
	}
	parts := strings.Split(path, "/")
	for _, r := range templ {
		if len(r.templateParts) != len(parts) {
			continue
		}
		match := true
		for i, t := range r.templateParts {
			if !(t == parts[i] || (strings.HasPrefix(t, "{") && parts[i] != "")) {
				match = false
				break
			}
		}
		if match {
			return r
		}
	}
	if strings.HasPrefix(path, "/metrics/") || strings.HasPrefix(path, "/static/") {
		return belowMount
	}
	return nil
}

// CheckRoute is routes.py's check_route.
func CheckRoute(method, path string) (*Route, *Refusal) {
	r := FindRoute(path)
	if r == nil {
		return nil, refuse(404, CodeRouteNotFound, "%s is not a route of the model server", path)
	}
	if r.Kind == Refused {
		return nil, refuse(403, CodePathForbidden, "%s is not served here", r.Path)
	}
	for rest, more := r.Methods, true; more; {
		var m string
		m, rest, more = strings.Cut(rest, ",")
		if m == method {
			return r, nil
		}
	}
	return nil, refuse(405, CodeMethodNotAllowed, "%s accepts %s, not %s", r.Path, r.Methods, method)
}
