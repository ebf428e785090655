/* xml.h — text written into an XML/SVG document, with the five characters
 * that would end it (& < > " ') as entities. Header-only: the SVG writers
 * (prof/roofline.c, opt/analyze_svg.c) share it. */
#ifndef NSTF_CORE_XML_H
#define NSTF_CORE_XML_H

#include <stdio.h>

static inline void nstf_xml_text(FILE *f, const char *s) {
    for (; s && *s; s++) {
        switch (*s) {
        case '&': fputs("&amp;", f); break;
        case '<': fputs("&lt;", f); break;
        case '>': fputs("&gt;", f); break;
        case '"': fputs("&quot;", f); break;
        case '\'': fputs("&apos;", f); break;
        default: fputc(*s, f);
        }
    }
}

#endif
