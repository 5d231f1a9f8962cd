/*
 * Container image references: the grammar of tether/hooks/imageref.py, checked in the client
 * (srun/sbatch/salloc) and in slurmstepd so a bad --container-image fails where it is typed.
 */
#ifndef TETHER_IMAGEREF_H
#define TETHER_IMAGEREF_H

/* Is ``value`` an accepted image reference (an absolute path, a registry image, a URI)? */
int tether_image_ok(const char *value);

/* Does a refused ``value`` look like a relative path to a local image (for the message's hint)? */
int tether_image_looks_local(const char *value);

#endif
