// Compatibility shim, added to a build-time copy of virtual-workspace-framework's
// pkg/forwardingregistry (see build.sh); nothing in the module cache is changed.
//
// kcp v0.32.3 calls forwardingregistry.ValidatePathSegmentName, which its (unpublished) v0.32
// staging module exports. The newest published release, v0.31.2, passes apimachinery's
// path.ValidatePathSegmentName at the same place, so this alias is all the difference.
package forwardingregistry

import "k8s.io/apimachinery/pkg/api/validation/path"

// ValidatePathSegmentName is apimachinery's validator for object names used as path segments.
var ValidatePathSegmentName = path.ValidatePathSegmentName
