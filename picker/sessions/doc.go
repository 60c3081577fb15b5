// Package sessions is the plain-Go half of the session-affinity plugin (no GIE import):
// which session a request names (ID, the port of promptcache.contract.session's
// request_session, held to it by the shared vectors) and the store that pins a session to
// a pod (Store: a pin lives ttl after its last use, at most max sessions are tracked and
// the least recently used goes first, and a pin whose pod is no longer offered is
// released). The GIE glue is picker/plugins/sessionaffinity; README.md says what it does.
package sessions
