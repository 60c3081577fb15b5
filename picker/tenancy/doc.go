// Package tenancy is the plain-Go half of promptcache's picker plugins: the tenant salt,
// the isolation-key grammar and limits, the account digest, the signed identity header
// and its body digest, and the decision that combines them. It imports nothing of GIE.
//
// The Python package promptcache.tenancy (operator/promptcache/tenancy) is the source of
// every definition here; this is a port held to it by test vectors generated from the
// Python functions (tools/picker_vectors.py writes ../testvectors/vectors.json, and the
// tests of this package read it). Change the Python side first, regenerate the vectors,
// then follow here: a change one side makes that the other does not cannot pass.
package tenancy
